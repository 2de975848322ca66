;; The page's arithmetic on WebAssembly 128-bit SIMD (sampler.js, WasmKernels), float32. Every
;; address is a byte offset into the imported memory.
;;
;; dense: out (N, Op) = x (N, I) @ W + b. W is packed in panels of 8 outputs: panel k holds
;; W[i, 8k .. 8k+7] for i = 0..I-1, contiguous (I x 8 floats); b and out are padded to Op, a
;; multiple of 8. Images go 4 at a time (8 accumulators: each weight vector loaded serves four
;; images); the N mod 4 left over go one at a time, with even and odd inputs summed apart (two
;; chains of additions instead of one).
;;
;; attend: the linear attention's recurrence for N images of T positions each, H heads of E
;; features (E a multiple of 4), as PixelTransformer.step: per position, S += phi(k) v^T,
;; z += phi(k), then att = phi(q) S / (phi(q) . z + eps). phi is applied beforehand, by `phi`.
;;
;; phi, gelu: the elementwise maps, in place (sampler.js's phi and gelu are their references):
;; phi(x) = elu(x) + 1 on strided rows (q and k of each qkv row), GELU(x) = x (1 + erf(x / sqrt 2)) / 2
;; with sampler.js's erf (Abramowitz & Stegun 7.1.26). WebAssembly has no exp: $exp_neg is Cephes'
;; expf (2^n times a degree-6 polynomial on |r| <= ln 2 / 2) for the x <= 0 both need.
;;
;; kernels.wasm is this file assembled (tests/test_export.py checks that they match):
;;   python -c "import wasmtime; open('kernels.wasm', 'wb').write(wasmtime.wat2wasm(open('kernels.wat').read()))"
(module
  (import "env" "memory" (memory 1))
  (func (export "dense") (param $x i32) (param $n i32) (param $nin i32) (param $w i32) (param $b i32)
                          (param $nout i32) (param $out i32)
    (local $p i32) (local $wp i32) (local $wend i32) (local $r i32) (local $xr i32) (local $row i32)
    (local $o i32) (local $wi i32) (local $xi i32)
    (local $b0 v128) (local $b1 v128) (local $w0 v128) (local $w1 v128) (local $s v128)
    (local $a0 v128) (local $a1 v128) (local $c0 v128) (local $c1 v128)
    (local $d0 v128) (local $d1 v128) (local $e0 v128) (local $e1 v128)
    (local.set $row (i32.shl (local.get $nin) (i32.const 2)))          ;; bytes per input row
    (local.set $p (i32.const 0))
    (block $panels_done
      (loop $panels
        (br_if $panels_done (i32.ge_u (local.get $p) (local.get $nout)))
        (local.set $wp (i32.add (local.get $w) (i32.mul (local.get $p) (local.get $row))))  ;; $p counts outputs: panel p/8 starts p*I*4 bytes in
        (local.set $wend (i32.add (local.get $wp) (i32.shl (local.get $row) (i32.const 3))))
        (local.set $b0 (v128.load (i32.add (local.get $b) (i32.shl (local.get $p) (i32.const 2)))))
        (local.set $b1 (v128.load offset=16 (i32.add (local.get $b) (i32.shl (local.get $p) (i32.const 2)))))
        (local.set $r (i32.const 0))
        ;; four images at a time
        (block $quads_done
          (loop $quads
            (br_if $quads_done (i32.gt_u (i32.add (local.get $r) (i32.const 4)) (local.get $n)))
            (local.set $a0 (local.get $b0)) (local.set $a1 (local.get $b1))
            (local.set $c0 (local.get $b0)) (local.set $c1 (local.get $b1))
            (local.set $d0 (local.get $b0)) (local.set $d1 (local.get $b1))
            (local.set $e0 (local.get $b0)) (local.set $e1 (local.get $b1))
            (local.set $xi (i32.add (local.get $x) (i32.mul (local.get $r) (local.get $row))))
            (local.set $wi (local.get $wp))
            (block $k_done
              (loop $k
                (br_if $k_done (i32.ge_u (local.get $wi) (local.get $wend)))
                (local.set $w0 (v128.load (local.get $wi)))
                (local.set $w1 (v128.load offset=16 (local.get $wi)))
                (local.set $s (v128.load32_splat (local.get $xi)))
                (local.set $a0 (f32x4.add (local.get $a0) (f32x4.mul (local.get $s) (local.get $w0))))
                (local.set $a1 (f32x4.add (local.get $a1) (f32x4.mul (local.get $s) (local.get $w1))))
                (local.set $s (v128.load32_splat (i32.add (local.get $xi) (local.get $row))))
                (local.set $c0 (f32x4.add (local.get $c0) (f32x4.mul (local.get $s) (local.get $w0))))
                (local.set $c1 (f32x4.add (local.get $c1) (f32x4.mul (local.get $s) (local.get $w1))))
                (local.set $s (v128.load32_splat (i32.add (local.get $xi) (i32.shl (local.get $row) (i32.const 1)))))
                (local.set $d0 (f32x4.add (local.get $d0) (f32x4.mul (local.get $s) (local.get $w0))))
                (local.set $d1 (f32x4.add (local.get $d1) (f32x4.mul (local.get $s) (local.get $w1))))
                (local.set $s (v128.load32_splat (i32.add (local.get $xi) (i32.mul (local.get $row) (i32.const 3)))))
                (local.set $e0 (f32x4.add (local.get $e0) (f32x4.mul (local.get $s) (local.get $w0))))
                (local.set $e1 (f32x4.add (local.get $e1) (f32x4.mul (local.get $s) (local.get $w1))))
                (local.set $wi (i32.add (local.get $wi) (i32.const 32)))
                (local.set $xi (i32.add (local.get $xi) (i32.const 4)))
                (br $k)))
            (local.set $o (i32.add (local.get $out)
                                   (i32.shl (i32.add (i32.mul (local.get $r) (local.get $nout)) (local.get $p)) (i32.const 2))))
            (v128.store (local.get $o) (local.get $a0)) (v128.store offset=16 (local.get $o) (local.get $a1))
            (local.set $o (i32.add (local.get $o) (i32.shl (local.get $nout) (i32.const 2))))
            (v128.store (local.get $o) (local.get $c0)) (v128.store offset=16 (local.get $o) (local.get $c1))
            (local.set $o (i32.add (local.get $o) (i32.shl (local.get $nout) (i32.const 2))))
            (v128.store (local.get $o) (local.get $d0)) (v128.store offset=16 (local.get $o) (local.get $d1))
            (local.set $o (i32.add (local.get $o) (i32.shl (local.get $nout) (i32.const 2))))
            (v128.store (local.get $o) (local.get $e0)) (v128.store offset=16 (local.get $o) (local.get $e1))
            (local.set $r (i32.add (local.get $r) (i32.const 4)))
            (br $quads)))
        ;; the images left over, one at a time (two accumulator pairs: even and odd inputs)
        (block $ones_done
          (loop $ones
            (br_if $ones_done (i32.ge_u (local.get $r) (local.get $n)))
            (local.set $a0 (local.get $b0)) (local.set $a1 (local.get $b1))
            (local.set $c0 (v128.const f32x4 0 0 0 0)) (local.set $c1 (v128.const f32x4 0 0 0 0))
            (local.set $xi (i32.add (local.get $x) (i32.mul (local.get $r) (local.get $row))))
            (local.set $wi (local.get $wp))
            (block $k1_done
              (loop $k1
                (br_if $k1_done (i32.ge_u (i32.add (local.get $wi) (i32.const 32)) (local.get $wend)))
                (local.set $s (v128.load32_splat (local.get $xi)))
                (local.set $a0 (f32x4.add (local.get $a0) (f32x4.mul (local.get $s) (v128.load (local.get $wi)))))
                (local.set $a1 (f32x4.add (local.get $a1) (f32x4.mul (local.get $s) (v128.load offset=16 (local.get $wi)))))
                (local.set $s (v128.load32_splat offset=4 (local.get $xi)))
                (local.set $c0 (f32x4.add (local.get $c0) (f32x4.mul (local.get $s) (v128.load offset=32 (local.get $wi)))))
                (local.set $c1 (f32x4.add (local.get $c1) (f32x4.mul (local.get $s) (v128.load offset=48 (local.get $wi)))))
                (local.set $wi (i32.add (local.get $wi) (i32.const 64)))
                (local.set $xi (i32.add (local.get $xi) (i32.const 8)))
                (br $k1)))
            (if (i32.lt_u (local.get $wi) (local.get $wend))            ;; an odd input count: the last one
              (then
                (local.set $s (v128.load32_splat (local.get $xi)))
                (local.set $a0 (f32x4.add (local.get $a0) (f32x4.mul (local.get $s) (v128.load (local.get $wi)))))
                (local.set $a1 (f32x4.add (local.get $a1) (f32x4.mul (local.get $s) (v128.load offset=16 (local.get $wi)))))))
            (local.set $o (i32.add (local.get $out)
                                   (i32.shl (i32.add (i32.mul (local.get $r) (local.get $nout)) (local.get $p)) (i32.const 2))))
            (v128.store (local.get $o) (f32x4.add (local.get $a0) (local.get $c0)))
            (v128.store offset=16 (local.get $o) (f32x4.add (local.get $a1) (local.get $c1)))
            (local.set $r (i32.add (local.get $r) (i32.const 1)))
            (br $ones)))
        (local.set $p (i32.add (local.get $p) (i32.const 8)))
        (br $panels))))

  ;; qkv (N*T, 3D) rows: phi(q) at h*E, phi(k) at D + h*E, v at 2D + h*E; S (N, H, E, E), z (N, H, E);
  ;; att (N*T, D) rows, head h at h*E. Image r's positions are rows r*T .. r*T+T-1.
  (func (export "attend") (param $qkv i32) (param $n i32) (param $T i32) (param $S i32) (param $z i32)
                           (param $att i32) (param $H i32) (param $E i32) (param $eps f32)
    (local $D i32) (local $r i32) (local $h i32) (local $k i32) (local $i i32) (local $j i32)
    (local $rowq i32) (local $s i32) (local $zz i32) (local $out i32) (local $si i32)
    (local $pk v128) (local $pq v128) (local $x v128) (local $den f32) (local $inv v128)
    (local.set $D (i32.mul (local.get $H) (local.get $E)))
    (local.set $r (i32.const 0))
    (loop $images
      (local.set $h (i32.const 0))
      (loop $heads
        ;; this (image, head)'s state
        (local.set $s (i32.add (local.get $S)
          (i32.shl (i32.mul (i32.add (i32.mul (local.get $r) (local.get $H)) (local.get $h))
                            (i32.mul (local.get $E) (local.get $E))) (i32.const 2))))
        (local.set $zz (i32.add (local.get $z)
          (i32.shl (i32.mul (i32.add (i32.mul (local.get $r) (local.get $H)) (local.get $h)) (local.get $E))
                   (i32.const 2))))
        (local.set $k (i32.const 0))
        (loop $positions
          (local.set $rowq (i32.add (local.get $qkv) (i32.shl
            (i32.add (i32.mul (i32.add (i32.mul (local.get $r) (local.get $T)) (local.get $k))
                              (i32.mul (local.get $D) (i32.const 3)))
                     (i32.mul (local.get $h) (local.get $E))) (i32.const 2))))
          (local.set $out (i32.add (local.get $att) (i32.shl
            (i32.add (i32.mul (i32.add (i32.mul (local.get $r) (local.get $T)) (local.get $k)) (local.get $D))
                     (i32.mul (local.get $h) (local.get $E))) (i32.const 2))))
          ;; att = 0
          (local.set $j (i32.const 0))
          (loop $zero
            (v128.store (i32.add (local.get $out) (i32.shl (local.get $j) (i32.const 2))) (v128.const f32x4 0 0 0 0))
            (br_if $zero (i32.lt_u (local.tee $j (i32.add (local.get $j) (i32.const 4))) (local.get $E))))
          ;; row by row: S[i] += phi(k)_i v; z_i += phi(k)_i; att += phi(q)_i S[i]; den += phi(q)_i z_i
          (local.set $den (f32.const 0))
          (local.set $i (i32.const 0))
          (loop $rows
            (local.set $pk (v128.load32_splat (i32.add (local.get $rowq)
              (i32.shl (i32.add (local.get $D) (local.get $i)) (i32.const 2)))))
            (local.set $pq (v128.load32_splat (i32.add (local.get $rowq) (i32.shl (local.get $i) (i32.const 2)))))
            (f32.store (i32.add (local.get $zz) (i32.shl (local.get $i) (i32.const 2)))
              (f32.add (f32.load (i32.add (local.get $zz) (i32.shl (local.get $i) (i32.const 2))))
                       (f32x4.extract_lane 0 (local.get $pk))))
            (local.set $den (f32.add (local.get $den)
              (f32.mul (f32x4.extract_lane 0 (local.get $pq))
                       (f32.load (i32.add (local.get $zz) (i32.shl (local.get $i) (i32.const 2)))))))
            (local.set $si (i32.add (local.get $s) (i32.shl (i32.mul (local.get $i) (local.get $E)) (i32.const 2))))
            (local.set $j (i32.const 0))
            (loop $cols
              (local.set $x (f32x4.add (v128.load (i32.add (local.get $si) (i32.shl (local.get $j) (i32.const 2))))
                (f32x4.mul (local.get $pk) (v128.load (i32.add (local.get $rowq)
                  (i32.shl (i32.add (i32.shl (local.get $D) (i32.const 1)) (local.get $j)) (i32.const 2)))))))
              (v128.store (i32.add (local.get $si) (i32.shl (local.get $j) (i32.const 2))) (local.get $x))
              (v128.store (i32.add (local.get $out) (i32.shl (local.get $j) (i32.const 2)))
                (f32x4.add (v128.load (i32.add (local.get $out) (i32.shl (local.get $j) (i32.const 2))))
                           (f32x4.mul (local.get $pq) (local.get $x))))
              (br_if $cols (i32.lt_u (local.tee $j (i32.add (local.get $j) (i32.const 4))) (local.get $E))))
            (br_if $rows (i32.lt_u (local.tee $i (i32.add (local.get $i) (i32.const 1))) (local.get $E))))
          ;; att /= den + eps
          (local.set $inv (f32x4.splat (f32.div (f32.const 1) (f32.add (local.get $den) (local.get $eps)))))
          (local.set $j (i32.const 0))
          (loop $scale
            (v128.store (i32.add (local.get $out) (i32.shl (local.get $j) (i32.const 2)))
              (f32x4.mul (v128.load (i32.add (local.get $out) (i32.shl (local.get $j) (i32.const 2)))) (local.get $inv)))
            (br_if $scale (i32.lt_u (local.tee $j (i32.add (local.get $j) (i32.const 4))) (local.get $E))))
          (br_if $positions (i32.lt_u (local.tee $k (i32.add (local.get $k) (i32.const 1))) (local.get $T))))
        (br_if $heads (i32.lt_u (local.tee $h (i32.add (local.get $h) (i32.const 1))) (local.get $H))))
      (br_if $images (i32.lt_u (local.tee $r (i32.add (local.get $r) (i32.const 1))) (local.get $n)))))
  ;; e^x for x <= 0 (clamped to [-87, 0]: 2^n stays a normal float, e^-87 ~ 1.6e-38 for anything below)
  (func $exp_neg (param $x v128) (result v128)
    (local $n v128) (local $r v128) (local $p v128)
    (local.set $x (f32x4.max (f32x4.min (local.get $x) (v128.const f32x4 0 0 0 0))
                             (v128.const f32x4 -87 -87 -87 -87)))
    (local.set $n (f32x4.nearest (f32x4.mul (local.get $x)
                                            (v128.const f32x4 1.44269504 1.44269504 1.44269504 1.44269504))))
    ;; r = x - n ln 2, with ln 2 in two parts (0.693359375 is exact in a few bits: n times it is exact)
    (local.set $r (f32x4.sub (local.get $x)
                             (f32x4.mul (local.get $n) (v128.const f32x4 0.693359375 0.693359375 0.693359375 0.693359375))))
    (local.set $r (f32x4.add (local.get $r)
                             (f32x4.mul (local.get $n) (v128.const f32x4 2.12194440e-4 2.12194440e-4 2.12194440e-4 2.12194440e-4))))
    (local.set $p (v128.const f32x4 1.9875691500e-4 1.9875691500e-4 1.9875691500e-4 1.9875691500e-4))
    (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $r))
                             (v128.const f32x4 1.3981999507e-3 1.3981999507e-3 1.3981999507e-3 1.3981999507e-3)))
    (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $r))
                             (v128.const f32x4 8.3333337680e-3 8.3333337680e-3 8.3333337680e-3 8.3333337680e-3)))
    (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $r))
                             (v128.const f32x4 4.1665795894e-2 4.1665795894e-2 4.1665795894e-2 4.1665795894e-2)))
    (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $r))
                             (v128.const f32x4 1.6666665459e-1 1.6666665459e-1 1.6666665459e-1 1.6666665459e-1)))
    (local.set $p (f32x4.add (f32x4.mul (local.get $p) (local.get $r))
                             (v128.const f32x4 5.0000001201e-1 5.0000001201e-1 5.0000001201e-1 5.0000001201e-1)))
    ;; (p r^2 + r + 1) 2^n, 2^n built from its exponent bits (n in -126..0)
    (f32x4.mul (f32x4.add (f32x4.add (f32x4.mul (local.get $p) (f32x4.mul (local.get $r) (local.get $r)))
                                     (local.get $r))
                          (v128.const f32x4 1 1 1 1))
               (i32x4.shl (i32x4.add (i32x4.trunc_sat_f32x4_s (local.get $n)) (v128.const i32x4 127 127 127 127))
                          (i32.const 23))))

  ;; phi in place on `rows` rows of `cols` floats (a multiple of 4), rows `stride` floats apart
  (func (export "phi") (param $x i32) (param $rows i32) (param $cols i32) (param $stride i32)
    (local $p i32) (local $end i32) (local $v v128)
    (block $done
      (loop $row
        (br_if $done (i32.eqz (local.get $rows)))
        (local.set $p (local.get $x))
        (local.set $end (i32.add (local.get $x) (i32.shl (local.get $cols) (i32.const 2))))
        (block $row_done
          (loop $vec
            (br_if $row_done (i32.ge_u (local.get $p) (local.get $end)))
            (local.set $v (v128.load (local.get $p)))
            (v128.store (local.get $p)
              (v128.bitselect (f32x4.add (local.get $v) (v128.const f32x4 1 1 1 1))
                              (call $exp_neg (local.get $v))
                              (f32x4.gt (local.get $v) (v128.const f32x4 0 0 0 0))))
            (local.set $p (i32.add (local.get $p) (i32.const 16)))
            (br $vec)))
        (local.set $x (i32.add (local.get $x) (i32.shl (local.get $stride) (i32.const 2))))
        (local.set $rows (i32.sub (local.get $rows) (i32.const 1)))
        (br $row))))

  ;; GELU in place on `count` floats (a multiple of 4)
  (func (export "gelu") (param $x i32) (param $count i32)
    (local $end i32) (local $v v128) (local $a v128) (local $t v128) (local $p v128) (local $e v128)
    (local.set $end (i32.add (local.get $x) (i32.shl (local.get $count) (i32.const 2))))
    (block $done
      (loop $vec
        (br_if $done (i32.ge_u (local.get $x) (local.get $end)))
        (local.set $v (v128.load (local.get $x)))
        (local.set $a (f32x4.abs (f32x4.mul (local.get $v)
                                            (v128.const f32x4 0.70710678 0.70710678 0.70710678 0.70710678))))
        (local.set $t (f32x4.div (v128.const f32x4 1 1 1 1)
                                 (f32x4.add (v128.const f32x4 1 1 1 1)
                                            (f32x4.mul (local.get $a) (v128.const f32x4 0.3275911 0.3275911 0.3275911 0.3275911)))))
        (local.set $p (f32x4.add (f32x4.mul (local.get $t) (v128.const f32x4 1.061405429 1.061405429 1.061405429 1.061405429))
                                 (v128.const f32x4 -1.453152027 -1.453152027 -1.453152027 -1.453152027)))
        (local.set $p (f32x4.add (f32x4.mul (local.get $t) (local.get $p))
                                 (v128.const f32x4 1.421413741 1.421413741 1.421413741 1.421413741)))
        (local.set $p (f32x4.add (f32x4.mul (local.get $t) (local.get $p))
                                 (v128.const f32x4 -0.284496736 -0.284496736 -0.284496736 -0.284496736)))
        (local.set $p (f32x4.add (f32x4.mul (local.get $t) (local.get $p))
                                 (v128.const f32x4 0.254829592 0.254829592 0.254829592 0.254829592)))
        ;; erf(|x| / sqrt 2) = 1 - t p e^(-x^2 / 2), its sign x's
        (local.set $e (f32x4.sub (v128.const f32x4 1 1 1 1)
                                 (f32x4.mul (f32x4.mul (local.get $t) (local.get $p))
                                            (call $exp_neg (f32x4.neg (f32x4.mul (local.get $a) (local.get $a)))))))
        (local.set $e (v128.bitselect (f32x4.neg (local.get $e)) (local.get $e)
                                      (f32x4.lt (local.get $v) (v128.const f32x4 0 0 0 0))))
        (v128.store (local.get $x) (f32x4.mul (f32x4.mul (local.get $v) (v128.const f32x4 0.5 0.5 0.5 0.5))
                                              (f32x4.add (v128.const f32x4 1 1 1 1) (local.get $e))))
        (local.set $x (i32.add (local.get $x) (i32.const 16)))
        (br $vec)))))
