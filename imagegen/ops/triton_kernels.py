"""Triton kernels of the model's causal linear attention (wrapped in `triton_linear`).

Imports triton at the top: only `triton_linear` imports this module, lazily. Compiled for CUDA
tensors; when TRITON_INTERPRET=1 was set before triton was imported, Triton's interpreter runs
them on CPU tensors instead (numpy; how the tests check the arithmetic without a GPU).

Shapes (per batch-head program): q, k (L, E), v (L, M) raw; phi(x) = elu(x) + 1, written
where(x > 0, x + 1, exp(x)); phi'(x) = where(x > 0, 1, exp(x)) (`phi`, `dphi`). Chunks of C
positions: masked products inside a chunk with tl.dot, the state S = sum phi(k) v^T (E, M) and
z = sum phi(k) (E) carried to the next chunk, all summed in float32. Padding rows and columns
(the tail chunk, E and M below the block size) are zeroed after phi, since phi(0) = 1.
With MAPPED (a constexpr) q and k arrive as features already (another feature map applied by
PyTorch, whose autograd carries the gradient on through it): phi is the identity, phi' = 1.
Programs read their batch-head's rows through (n, h, l, e) strides, so q, k, v may be views
of one projection; 64-bit offsets.
"""
import triton
import triton.language as tl


@triton.jit
def tile(ptr, rows, cols, s_row, s_col, mask):
    """The (rows, cols) tile at ptr with strides s_row, s_col as float32, zero where not mask."""
    return tl.load(ptr + rows[:, None] * s_row + cols[None, :] * s_col, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def phi(x, mask, MAPPED: tl.constexpr):
    """elu(x) + 1 (x itself if MAPPED) where mask, else 0 (padding must not add phi(0) = 1 to the sums)."""
    if MAPPED:
        return tl.where(mask, x, 0.0)
    return tl.where(mask, tl.where(x > 0, x + 1, tl.exp(x)), 0.0)


@triton.jit
def dphi(x, MAPPED: tl.constexpr):
    """The derivative of elu(x) + 1 (1 if MAPPED)."""
    if MAPPED:
        return tl.full(x.shape, 1.0, tl.float32)
    return tl.where(x > 0, 1.0, tl.exp(x))


@triton.jit
def forward(q_ptr, k_ptr, v_ptr, o_ptr, inv_ptr,
            sq_n, sq_h, sq_l, sq_e, sk_n, sk_h, sk_l, sk_e, sv_n, sv_h, sv_l, sv_m, so_n, so_h, so_l, so_m,
            H, L, E, M, eps, C: tl.constexpr, BE: tl.constexpr, BM: tl.constexpr, PREC: tl.constexpr,
            MAPPED: tl.constexpr):
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
        q = tile(q_ptr, rl, re, sq_l, sq_e, mle)
        k = tile(k_ptr, rl, re, sk_l, sk_e, mle)
        v = tile(v_ptr, rl, rm, sv_l, sv_m, mlm)
        qf = phi(q, mle, MAPPED)
        kf = phi(k, mle, MAPPED)
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
def backward_qk(q_ptr, k_ptr, v_ptr, g_ptr, inv_ptr, gd_ptr, d_ptr,
                sq_n, sq_h, sq_l, sq_e, sk_n, sk_h, sk_l, sk_e, sv_n, sv_h, sv_l, sv_m, sg_n, sg_h, sg_l, sg_m,
                sd_n, sd_h, sd_l, sd_e, H, L, E, M,
                C: tl.constexpr, BE: tl.constexpr, BMF: tl.constexpr, PREC: tl.constexpr, REVERSE: tl.constexpr,
                MAPPED: tl.constexpr):
    """Grid (N H, ceil(E / BE)): dq (REVERSE False) or dk (True) for the E block of this program.
    With gn_i = g_i inv_i (M,), gd_i = -(g_i . out_i) inv_i, a_i = [gn_i, gd_i] and b_j = [v_j, 1]:
        dphi(q)_i = sum_{j<=i} (a_i . b_j) phi(k_j)    chunks first to last,
        dphi(k)_j = sum_{i>=j} (b_j . a_i) phi(q_i)    chunks last to first:
    one sum over rows r of x against the rows c before (after) them of y and f, with x, y, f
    = a, b, phi(k) for dq and b, a, phi(q) for dk, and the state sum_c f_c y_c^T ([S, z] for dq)
    carried between chunks. BMF covers all of M; x, y are split as (xm (M,), xa) and (ym, ya)."""
    bh, pe = tl.program_id(0), tl.program_id(1)
    n, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    q_ptr += n * sq_n + h * sq_h
    k_ptr += n * sk_n + h * sk_h
    v_ptr += n * sv_n + h * sv_h
    g_ptr += n * sg_n + h * sg_h
    d_ptr += n * sd_n + h * sd_h
    inv_ptr += bh.to(tl.int64) * L
    gd_ptr += bh.to(tl.int64) * L
    rc, re, rm = tl.arange(0, C), pe * BE + tl.arange(0, BE), tl.arange(0, BMF)
    me, mm = re < E, rm < M
    if REVERSE:
        before = rc[:, None] <= rc[None, :]                    # (r, c): c at or after r
    else:
        before = rc[:, None] >= rc[None, :]                    # (r, c): c at or before r
    S = tl.zeros((BE, BMF), dtype=tl.float32)                  # sum_c f_c ym_c^T
    z = tl.zeros((BE,), dtype=tl.float32)                      # sum_c f_c ya_c
    n_chunks = tl.cdiv(L, C)
    for i in range(0, n_chunks):
        if REVERSE:
            rl = (n_chunks - 1 - i) * C + rc
        else:
            rl = i * C + rc
        ml = rl < L
        mle, mlm = ml[:, None] & me[None, :], ml[:, None] & mm[None, :]
        q = tile(q_ptr, rl, re, sq_l, sq_e, mle)
        k = tile(k_ptr, rl, re, sk_l, sk_e, mle)
        v = tile(v_ptr, rl, rm, sv_l, sv_m, mlm)
        gn = tile(g_ptr, rl, rm, sg_l, sg_m, mlm) * tl.load(inv_ptr + rl, mask=ml, other=0.0)[:, None]
        gd = tl.load(gd_ptr + rl, mask=ml, other=0.0)
        ones = ml.to(tl.float32)
        if REVERSE:
            xm, xa, ym, ya, f, raw = v, ones, gn, gd, phi(q, mle, MAPPED), k
        else:
            xm, xa, ym, ya, f, raw = gn, gd, v, ones, phi(k, mle, MAPPED), q
        B = tl.where(before, tl.dot(xm, tl.trans(ym), input_precision=PREC) + xa[:, None] * ya[None, :], 0.0)
        d = (tl.dot(B, f, input_precision=PREC) + tl.dot(xm, tl.trans(S), input_precision=PREC)
             + xa[:, None] * z[None, :]) * dphi(raw, MAPPED)
        tl.store(d_ptr + rl[:, None] * sd_l + re[None, :] * sd_e, d.to(d_ptr.dtype.element_ty), mask=mle)
        S += tl.dot(tl.trans(f), ym, input_precision=PREC)
        z += tl.sum(f * ya[:, None], 0)


@triton.jit
def backward_dv(q_ptr, k_ptr, g_ptr, inv_ptr, dv_ptr,
                sq_n, sq_h, sq_l, sq_e, sk_n, sk_h, sk_l, sk_e, sg_n, sg_h, sg_l, sg_m, sd_n, sd_h, sd_l, sd_m,
                H, L, E, M, C: tl.constexpr, BEF: tl.constexpr, BM: tl.constexpr, PREC: tl.constexpr,
                MAPPED: tl.constexpr):
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
        q = tile(q_ptr, rl, re, sq_l, sq_e, mle)
        k = tile(k_ptr, rl, re, sk_l, sk_e, mle)
        g = tile(g_ptr, rl, rm, sg_l, sg_m, mlm)
        gn = g * tl.load(inv_ptr + rl, mask=ml, other=0.0)[:, None]
        qf = phi(q, mle, MAPPED)
        kf = phi(k, mle, MAPPED)
        At = tl.where(anticausal, tl.dot(kf, tl.trans(qf), input_precision=PREC), 0.0)  # (C_j, C_i)
        dv = tl.dot(At, gn, input_precision=PREC) + tl.dot(kf, dS, input_precision=PREC)
        tl.store(dv_ptr + rl[:, None] * sd_l + rm[None, :] * sd_m, dv.to(dv_ptr.dtype.element_ty), mask=mlm)
        dS += tl.dot(tl.trans(qf), gn, input_precision=PREC)


@triton.jit
def step(q_ptr, k_ptr, v_ptr, s_ptr, o_ptr, sq_n, sq_h, sq_e, sk_n, sk_h, sk_e, sv_n, sv_h, sv_m,
         ss_b, ss_e, ss_m, so_n, so_h, so_m, H, E, M, eps, BE: tl.constexpr, BM: tl.constexpr,
         MAPPED: tl.constexpr):
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
    qf = phi(q, me, MAPPED)
    kf = phi(k, me, MAPPED)
    s_ptr += bh.to(tl.int64) * ss_b
    S = tile(s_ptr, re, rm, ss_e, ss_m, mem)
    z = tl.load(s_ptr + re * ss_e + M * ss_m, mask=me, other=0.0).to(tl.float32)
    S += kf[:, None] * v[None, :]
    z += kf
    tl.store(s_ptr + re[:, None] * ss_e + rm[None, :] * ss_m, S.to(s_ptr.dtype.element_ty), mask=mem)
    tl.store(s_ptr + re * ss_e + M * ss_m, z.to(s_ptr.dtype.element_ty), mask=me)
    out = tl.sum(qf[:, None] * S, 0) / (tl.sum(qf * z, 0) + eps)
    tl.store(o_ptr + n * so_n + h * so_h + rm * so_m, out.to(o_ptr.dtype.element_ty), mask=mm)
