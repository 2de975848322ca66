;; The page's products on WebAssembly 128-bit SIMD (sampler.js, WasmProducts): out (N, Op) =
;; x (N, I) @ W + b in float32. W is packed in panels of 8 outputs: panel k holds W[i, 8k .. 8k+7]
;; for i = 0..I-1, contiguous (I x 8 floats); b and out are padded to Op, a multiple of 8. Every
;; address is a byte offset into the imported memory. Images go 4 at a time (8 accumulators: each
;; weight vector loaded serves four images); the N mod 4 left over go one at a time, with even and
;; odd inputs summed apart (two chains of additions instead of one).
;; dense.wasm is this file assembled (tests/test_export.py checks that they match):
;;   python -c "import wasmtime; open('dense.wasm', 'wb').write(wasmtime.wat2wasm(open('dense.wat').read()))"
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
        (br $panels)))))
