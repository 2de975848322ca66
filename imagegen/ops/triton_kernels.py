"""Triton kernels of the model's causal linear attention (wrapped in `triton_linear`).

Imports triton at the top: only `triton_linear` imports this module, lazily. Compiled for CUDA
tensors; when TRITON_INTERPRET=1 was set before triton was imported, Triton's interpreter runs
them on CPU tensors instead (numpy; how the tests check the arithmetic without a GPU).

Shapes (per batch-head program): q, k (L, E), v (L, M) raw; phi(x) = elu(x) + 1, written
where(x > 0, x + 1, exp(x)); phi'(x) = where(x > 0, 1, exp(x)). Chunks of C positions:
masked products inside a chunk with tl.dot, the state S = sum phi(k) v^T (E, M) and
z = sum phi(k) (E) carried to the next chunk, all summed in float32. Padding rows and columns
(the tail chunk, E and M below the block size) are zeroed after phi, since phi(0) = 1.
Programs read their batch-head's rows through (n, h, l, e) strides, so q, k, v may be views
of one projection; 64-bit offsets.
"""
import triton
import triton.language as tl


@triton.jit
def forward(q_ptr, k_ptr, v_ptr, o_ptr, inv_ptr,
            sq_n, sq_h, sq_l, sq_e, sk_n, sk_h, sk_l, sk_e, sv_n, sv_h, sv_l, sv_m, so_n, so_h, so_l, so_m,
            H, L, E, M, eps, C: tl.constexpr, BE: tl.constexpr, BM: tl.constexpr, PREC: tl.constexpr):
    """Grid (N H, ceil(M / BM)): out (L, M block) = phi(q) S_i / (phi(q) . z_i + eps) and, from
    the first M block, inv = 1 / (phi(q) . z_i + eps) (N H, L) for the backward."""
    bh, pm = tl.program_id(0), tl.program_id(1)
    n, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    q_ptr += n * sq_n + h * sq_h
    k_ptr += n * sk_n + h * sk_h
    v_ptr += n * sv_n + h * sv_h
    o_ptr += n * so_n + h * so_h
    inv_ptr += bh.to(tl.int64) * L
    rc, re, rm = tl.arange(0, C), tl.arange(0, BE), pm * BM + tl.arange(0, BM)
    me, mm = re < E, rm < M
    causal = rc[:, None] >= rc[None, :]                        # (i, j): j <= i
    S = tl.zeros((BE, BM), dtype=tl.float32)
    z = tl.zeros((BE,), dtype=tl.float32)
    for start in range(0, L, C):
        rl = start + rc
        ml = rl < L
        mle, mlm = ml[:, None] & me[None, :], ml[:, None] & mm[None, :]
        q = tl.load(q_ptr + rl[:, None] * sq_l + re[None, :] * sq_e, mask=mle, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + rl[:, None] * sk_l + re[None, :] * sk_e, mask=mle, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + rl[:, None] * sv_l + rm[None, :] * sv_m, mask=mlm, other=0.0).to(tl.float32)
        qf = tl.where(mle, tl.where(q > 0, q + 1, tl.exp(q)), 0.0)
        kf = tl.where(mle, tl.where(k > 0, k + 1, tl.exp(k)), 0.0)
        A = tl.where(causal, tl.dot(qf, tl.trans(kf), input_precision=PREC), 0.0)      # (C, C)
        num = tl.dot(A, v, input_precision=PREC) + tl.dot(qf, S, input_precision=PREC)  # (C, BM)
        inv = 1.0 / (tl.sum(A, 1) + tl.sum(qf * z[None, :], 1) + eps)                  # (C,)
        tl.store(o_ptr + rl[:, None] * so_l + rm[None, :] * so_m, (num * inv[:, None]).to(o_ptr.dtype.element_ty),
                 mask=mlm)
        if pm == 0:
            tl.store(inv_ptr + rl, inv, mask=ml)
        S += tl.dot(tl.trans(kf), v, input_precision=PREC)
        z += tl.sum(kf, 0)


@triton.jit
def backward_dq(q_ptr, k_ptr, v_ptr, g_ptr, inv_ptr, gd_ptr, dq_ptr,
                sq_n, sq_h, sq_l, sq_e, sk_n, sk_h, sk_l, sk_e, sv_n, sv_h, sv_l, sv_m, sg_n, sg_h, sg_l, sg_m,
                sd_n, sd_h, sd_l, sd_e, H, L, E, M,
                C: tl.constexpr, BE: tl.constexpr, BMF: tl.constexpr, PREC: tl.constexpr):
    """Grid (N H, ceil(E / BE)), chunks first to last. With gn_i = g_i inv_i (M,) and
    gd_i = -(g_i . out_i) inv_i: dphi(q)_i = sum_{j<=i} (gn_i . v_j + gd_i) phi(k_j)
    = S_i gn_i + gd_i z_i, for the E block of this program; BMF covers all of M."""
    bh, pe = tl.program_id(0), tl.program_id(1)
    n, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    q_ptr += n * sq_n + h * sq_h
    k_ptr += n * sk_n + h * sk_h
    v_ptr += n * sv_n + h * sv_h
    g_ptr += n * sg_n + h * sg_h
    dq_ptr += n * sd_n + h * sd_h
    inv_ptr += bh.to(tl.int64) * L
    gd_ptr += bh.to(tl.int64) * L
    rc, re, rm = tl.arange(0, C), pe * BE + tl.arange(0, BE), tl.arange(0, BMF)
    me, mm = re < E, rm < M
    causal = rc[:, None] >= rc[None, :]
    S = tl.zeros((BE, BMF), dtype=tl.float32)
    z = tl.zeros((BE,), dtype=tl.float32)
    for start in range(0, L, C):
        rl = start + rc
        ml = rl < L
        mle, mlm = ml[:, None] & me[None, :], ml[:, None] & mm[None, :]
        q = tl.load(q_ptr + rl[:, None] * sq_l + re[None, :] * sq_e, mask=mle, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + rl[:, None] * sk_l + re[None, :] * sk_e, mask=mle, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + rl[:, None] * sv_l + rm[None, :] * sv_m, mask=mlm, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + rl[:, None] * sg_l + rm[None, :] * sg_m, mask=mlm, other=0.0).to(tl.float32)
        gn = g * tl.load(inv_ptr + rl, mask=ml, other=0.0)[:, None]
        gd = tl.load(gd_ptr + rl, mask=ml, other=0.0)
        kf = tl.where(mle, tl.where(k > 0, k + 1, tl.exp(k)), 0.0)
        B = tl.where(causal, tl.dot(gn, tl.trans(v), input_precision=PREC) + gd[:, None], 0.0)    # (C_i, C_j)
        dqf = (tl.dot(B, kf, input_precision=PREC) + tl.dot(gn, tl.trans(S), input_precision=PREC)
               + gd[:, None] * z[None, :])
        dq = dqf * tl.where(q > 0, 1.0, tl.exp(q))
        tl.store(dq_ptr + rl[:, None] * sd_l + re[None, :] * sd_e, dq.to(dq_ptr.dtype.element_ty), mask=mle)
        S += tl.dot(tl.trans(kf), v, input_precision=PREC)
        z += tl.sum(kf, 0)


@triton.jit
def backward_dk(q_ptr, k_ptr, v_ptr, g_ptr, inv_ptr, gd_ptr, dk_ptr,
                sq_n, sq_h, sq_l, sq_e, sk_n, sk_h, sk_l, sk_e, sv_n, sv_h, sv_l, sv_m, sg_n, sg_h, sg_l, sg_m,
                sd_n, sd_h, sd_l, sd_e, H, L, E, M,
                C: tl.constexpr, BE: tl.constexpr, BMF: tl.constexpr, PREC: tl.constexpr):
    """Grid (N H, ceil(E / BE)), chunks last to first: dphi(k)_j = sum_{i>=j} (gn_i . v_j + gd_i) phi(q_i)
    = dS_j v_j + dz_j with dS_j = sum_{i>=j} phi(q_i) gn_i^T (E block, M), dz_j = sum_{i>=j} gd_i phi(q_i)."""
    bh, pe = tl.program_id(0), tl.program_id(1)
    n, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    q_ptr += n * sq_n + h * sq_h
    k_ptr += n * sk_n + h * sk_h
    v_ptr += n * sv_n + h * sv_h
    g_ptr += n * sg_n + h * sg_h
    dk_ptr += n * sd_n + h * sd_h
    inv_ptr += bh.to(tl.int64) * L
    gd_ptr += bh.to(tl.int64) * L
    rc, re, rm = tl.arange(0, C), pe * BE + tl.arange(0, BE), tl.arange(0, BMF)
    me, mm = re < E, rm < M
    anticausal = rc[:, None] <= rc[None, :]                    # (j, i): i >= j
    dS = tl.zeros((BE, BMF), dtype=tl.float32)
    dz = tl.zeros((BE,), dtype=tl.float32)
    n_chunks = tl.cdiv(L, C)
    for r in range(0, n_chunks):
        rl = (n_chunks - 1 - r) * C + rc
        ml = rl < L
        mle, mlm = ml[:, None] & me[None, :], ml[:, None] & mm[None, :]
        q = tl.load(q_ptr + rl[:, None] * sq_l + re[None, :] * sq_e, mask=mle, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + rl[:, None] * sk_l + re[None, :] * sk_e, mask=mle, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + rl[:, None] * sv_l + rm[None, :] * sv_m, mask=mlm, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + rl[:, None] * sg_l + rm[None, :] * sg_m, mask=mlm, other=0.0).to(tl.float32)
        gn = g * tl.load(inv_ptr + rl, mask=ml, other=0.0)[:, None]
        gd = tl.load(gd_ptr + rl, mask=ml, other=0.0)
        qf = tl.where(mle, tl.where(q > 0, q + 1, tl.exp(q)), 0.0)
        Bt = tl.where(anticausal, tl.dot(v, tl.trans(gn), input_precision=PREC) + gd[None, :], 0.0)  # (C_j, C_i)
        dkf = (tl.dot(Bt, qf, input_precision=PREC) + tl.dot(v, tl.trans(dS), input_precision=PREC)
               + dz[None, :])
        dk = dkf * tl.where(k > 0, 1.0, tl.exp(k))
        tl.store(dk_ptr + rl[:, None] * sd_l + re[None, :] * sd_e, dk.to(dk_ptr.dtype.element_ty), mask=mle)
        dS += tl.dot(tl.trans(qf), gn, input_precision=PREC)
        dz += tl.sum(qf * gd[:, None], 0)


@triton.jit
def backward_dv(q_ptr, k_ptr, g_ptr, inv_ptr, dv_ptr,
                sq_n, sq_h, sq_l, sq_e, sk_n, sk_h, sk_l, sk_e, sg_n, sg_h, sg_l, sg_m, sd_n, sd_h, sd_l, sd_m,
                H, L, E, M, C: tl.constexpr, BEF: tl.constexpr, BM: tl.constexpr, PREC: tl.constexpr):
    """Grid (N H, ceil(M / BM)), chunks last to first: dv_j = sum_{i>=j} (phi(q_i) . phi(k_j)) gn_i
    = phi(k_j) dS_j with dS_j = sum_{i>=j} phi(q_i) gn_i^T (E, M block); BEF covers all of E."""
    bh, pm = tl.program_id(0), tl.program_id(1)
    n, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    q_ptr += n * sq_n + h * sq_h
    k_ptr += n * sk_n + h * sk_h
    g_ptr += n * sg_n + h * sg_h
    dv_ptr += n * sd_n + h * sd_h
    inv_ptr += bh.to(tl.int64) * L
    rc, re, rm = tl.arange(0, C), tl.arange(0, BEF), pm * BM + tl.arange(0, BM)
    me, mm = re < E, rm < M
    anticausal = rc[:, None] <= rc[None, :]
    dS = tl.zeros((BEF, BM), dtype=tl.float32)
    n_chunks = tl.cdiv(L, C)
    for r in range(0, n_chunks):
        rl = (n_chunks - 1 - r) * C + rc
        ml = rl < L
        mle, mlm = ml[:, None] & me[None, :], ml[:, None] & mm[None, :]
        q = tl.load(q_ptr + rl[:, None] * sq_l + re[None, :] * sq_e, mask=mle, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + rl[:, None] * sk_l + re[None, :] * sk_e, mask=mle, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + rl[:, None] * sg_l + rm[None, :] * sg_m, mask=mlm, other=0.0).to(tl.float32)
        gn = g * tl.load(inv_ptr + rl, mask=ml, other=0.0)[:, None]
        qf = tl.where(mle, tl.where(q > 0, q + 1, tl.exp(q)), 0.0)
        kf = tl.where(mle, tl.where(k > 0, k + 1, tl.exp(k)), 0.0)
        At = tl.where(anticausal, tl.dot(kf, tl.trans(qf), input_precision=PREC), 0.0)  # (C_j, C_i)
        dv = tl.dot(At, gn, input_precision=PREC) + tl.dot(kf, dS, input_precision=PREC)
        tl.store(dv_ptr + rl[:, None] * sd_l + rm[None, :] * sd_m, dv.to(dv_ptr.dtype.element_ty), mask=mlm)
        dS += tl.dot(tl.trans(qf), gn, input_precision=PREC)


@triton.jit
def step(q_ptr, k_ptr, v_ptr, s_ptr, o_ptr, sq_n, sq_h, sq_e, sk_n, sk_h, sk_e, sv_n, sv_h, sv_m,
         ss_b, ss_e, ss_m, so_n, so_h, so_m, H, E, M, eps, BE: tl.constexpr, BM: tl.constexpr):
    """Grid (N H,): one decoding position. q, k (E,), v (M,) raw; the state (N H, E, M + 1) holds S
    and, in its last column, z: S += phi(k) v^T, z += phi(k) (written back in place), then
    out = phi(q) S / (phi(q) . z + eps) (M,)."""
    bh = tl.program_id(0)
    n, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    re, rm = tl.arange(0, BE), tl.arange(0, BM)
    me, mm = re < E, rm < M
    mem = me[:, None] & mm[None, :]
    q = tl.load(q_ptr + n * sq_n + h * sq_h + re * sq_e, mask=me, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + n * sk_n + h * sk_h + re * sk_e, mask=me, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + n * sv_n + h * sv_h + rm * sv_m, mask=mm, other=0.0).to(tl.float32)
    qf = tl.where(me, tl.where(q > 0, q + 1, tl.exp(q)), 0.0)
    kf = tl.where(me, tl.where(k > 0, k + 1, tl.exp(k)), 0.0)
    s_ptr += bh.to(tl.int64) * ss_b
    S = tl.load(s_ptr + re[:, None] * ss_e + rm[None, :] * ss_m, mask=mem, other=0.0).to(tl.float32)
    z = tl.load(s_ptr + re * ss_e + M * ss_m, mask=me, other=0.0).to(tl.float32)
    S += kf[:, None] * v[None, :]
    z += kf
    tl.store(s_ptr + re[:, None] * ss_e + rm[None, :] * ss_m, S.to(s_ptr.dtype.element_ty), mask=mem)
    tl.store(s_ptr + re * ss_e + M * ss_m, z.to(s_ptr.dtype.element_ty), mask=me)
    out = tl.sum(qf[:, None] * S, 0) / (tl.sum(qf * z, 0) + eps)
    tl.store(o_ptr + n * so_n + h * so_h + rm * so_m, out.to(o_ptr.dtype.element_ty), mask=mm)
