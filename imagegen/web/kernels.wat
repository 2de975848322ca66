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
;; z += phi(k), then att = phi(q) S / (phi(q) . z + eps). phi is applied beforehand (JavaScript has
;; exp; WebAssembly has none).
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
      (br_if $images (i32.lt_u (local.tee $r (i32.add (local.get $r) (i32.const 1))) (local.get $n))))))
