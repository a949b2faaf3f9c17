"""Planted mistakes for chapter 07_flash_triton: each must lose its question's points and get its hint.

Used by tests/grading/test_assignments.py, which grades a small class of made-up students with otter, and by
tests/checks/test_checks_flash.py, which runs each against its check directly.
Each entry: student -> function name -> (the planted code, the question, a phrase of the hint).
"""

CHAPTER = "07_flash_triton"

# The frame of the Triton exercise around the student's update; {update} is indented 8 spaces.
KERNEL = '''def small_attention_kernel(Q, K, V, Out, M, n_k, scale, tau, N_Q: tl.constexpr, HEAD_DIM: tl.constexpr,
                           BLOCK_N: tl.constexpr):
    rows = tl.arange(0, N_Q)
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + rows[:, None] * HEAD_DIM + dims[None, :])
    m_i = tl.full([N_Q], float("-inf"), tl.float32)
    l_i = tl.zeros([N_Q], tl.float32)
    acc = tl.zeros([N_Q, HEAD_DIM], tl.float32)
    for start in range(0, n_k, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        inside = cols < n_k
        k = tl.load(K + cols[:, None] * HEAD_DIM + dims[None, :], mask=inside[:, None], other=0.0)
        v = tl.load(V + cols[:, None] * HEAD_DIM + dims[None, :], mask=inside[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * (scale * 1.4426950408889634)
        s = tl.where(inside[None, :], s, float("-inf"))
{update}
    tl.store(Out + rows[:, None] * HEAD_DIM + dims[None, :], acc / l_i[:, None])
    tl.store(M + rows, m_i)


small_attention_kernel = triton.jit(small_attention_kernel)
'''

UPDATE = '''        tile_max = tl.max(s, 1)
        if tl.max(tile_max - m_i, 0) > tau:
            m_new = tl.maximum(m_i, tile_max)
            alpha = tl.exp2(m_i - m_new)
            l_i = alpha * l_i
            acc = alpha[:, None] * acc
            m_i = m_new
        p = tl.exp2(s - m_i[:, None])
        l_i = l_i + tl.sum(p, 1)
        acc = acc + tl.dot(p, v, input_precision="ieee")'''

# Each row decides alone: right output, but every tile is multiplied by alpha (1 where nothing changed).
ROW_BY_ROW = '''        tile_max = tl.max(s, 1)
        m_new = tl.where(tile_max > m_i + tau, tile_max, m_i)
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new'''

# The chapter's own update: the maximum raised at every tile that holds a larger score.
ALWAYS = ROW_BY_ROW.replace("tl.where(tile_max > m_i + tau, tile_max, m_i)", "tl.maximum(m_i, tile_max)")

# One decision per tile and the right maxima, but no branch: alpha multiplies every tile.
NO_BRANCH = '''        tile_max = tl.max(s, 1)
        raise_all = tl.max(tile_max - m_i, 0) > tau
        m_new = tl.where(raise_all, tl.maximum(m_i, tile_max), m_i)
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new'''


def kernel_with(update: str) -> str:
    """The Triton exercise's cell with ``update`` as the student's rescaling step."""
    return KERNEL.format(update=update)


PLANTED = {}
SOLUTIONS = {}

# linus: the causal loop of chapter 06's section 2, the window forgotten
PLANTED.setdefault("linus", {})["window_tile_counts"] = (
        "def window_tile_counts(n, block_q, block_k, window):\n"
        "    computed = masked = 0\n"
        "    for q_start in range(0, n, block_q):\n"
        "        q_end = min(q_start + block_q, n)\n"
        "        for k_start in range(0, q_end, block_k):\n"
        "            computed += 1\n"
        "            masked += min(k_start + block_k, n) - 1 > q_start\n"
        "    return computed, masked\n",
        "q1_predict_tiles",
        "You counted the tiles of plain causal attention",
    )
PLANTED.setdefault("linus", {})["small_attention_kernel"] = (
        kernel_with(ROW_BY_ROW),
        "q2_triton_rescale",
        "each row decided alone",
    )
PLANTED.setdefault("grace", {})["window_tile_counts"] = (            # key i - window counted as seen
        "def window_tile_counts(n, block_q, block_k, window):\n"
        "    computed = masked = 0\n"
        "    for q_start in range(0, n, block_q):\n"
        "        q_last = min(q_start + block_q, n) - 1\n"
        "        for k_start in range(0, n, block_k):\n"
        "            k_last = min(k_start + block_k, n) - 1\n"
        "            if k_start > q_last or k_last < q_start - window:\n"
        "                continue\n"
        "            computed += 1\n"
        "            masked += not (k_last <= q_start and k_start >= q_last - window)\n"
        "    return computed, masked\n",
        "q1_predict_tiles",
        "Your window is one key too wide",
    )
PLANTED.setdefault("grace", {})["small_attention_kernel"] = (
        kernel_with(ALWAYS),
        "q2_triton_rescale",
        "your kernel raised m_i whenever a tile's maximum was larger",
    )
SOLUTIONS["window_tile_counts"] = (
        "def window_tile_counts(n, block_q, block_k, window):\n"
        "    computed = masked = 0\n"
        "    for q_start in range(0, n, block_q):\n"
        "        q_last = min(q_start + block_q, n) - 1\n"
        "        for k_start in range(0, n, block_k):\n"
        "            k_last = min(k_start + block_k, n) - 1\n"
        "            if k_start > q_last or k_last <= q_start - window:\n"
        "                continue\n"
        "            computed += 1\n"
        "            masked += not (k_last <= q_start and k_start > q_last - window)\n"
        "    return computed, masked\n"
    )
SOLUTIONS["small_attention_kernel"] = kernel_with(UPDATE)
PLANTED.setdefault("zoe", {})["window_tile_counts"] = (
        "def window_tile_counts(n, block_q, block_k, window):\n"
        "    from attn_course.flash.schedule import tile_counts\n"
        "    counts = tile_counts(n, n, block_q, block_k, causal=True)\n"
        "    return counts['computed'], counts['masked']\n",
        "q1_predict_tiles",
        "calls tile_counts, which this exercise forbids",
    )

# Exercise 3: the classmate's sliding-window decoding kernel. {visible} is its mask, {weights} the lines that
# measure alpha and p against the new maximum.
WINDOW_KERNEL = '''def fixed_window_kernel(Q, K, V, Out, M, n_k, scale, tau, N_Q: tl.constexpr, HEAD_DIM: tl.constexpr,
                        BLOCK_N: tl.constexpr):
    rows = tl.arange(0, N_Q)                                       # the N_Q new queries (tau is not used)
    dims = tl.arange(0, HEAD_DIM)
    position = rows + (n_k - N_Q)                                  # after n_k - N_Q cached keys
    window = 24                                                    # its own key and the 23 before it
    q = tl.load(Q + rows[:, None] * HEAD_DIM + dims[None, :])
    m_i = tl.full([N_Q], float("-inf"), tl.float32)
    l_i = tl.zeros([N_Q], tl.float32)
    acc = tl.zeros([N_Q, HEAD_DIM], tl.float32)
    for start in range(0, n_k, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        inside = cols < n_k
        k = tl.load(K + cols[:, None] * HEAD_DIM + dims[None, :], mask=inside[:, None], other=0.0)
        v = tl.load(V + cols[:, None] * HEAD_DIM + dims[None, :], mask=inside[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * (scale * 1.4426950408889634)
        visible = {visible}
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
{weights}
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new
    tl.store(Out + rows[:, None] * HEAD_DIM + dims[None, :], acc / l_i[:, None])
    tl.store(M + rows, m_i)


fixed_window_kernel = triton.jit(fixed_window_kernel)
'''

VISIBLE = ("inside[None, :] & (cols[None, :] <= position[:, None]) & "
           "(cols[None, :] > position[:, None] - window)")
AGAINST_NEW_MAX = '''        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])'''
SAFE_MAX = '''        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)       # a row that has seen no key yet
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])'''


def window_kernel_with(visible: str = VISIBLE, weights: str = SAFE_MAX) -> str:
    """Exercise 3's kernel cell with ``visible`` as its mask and ``weights`` as its alpha and p lines."""
    return WINDOW_KERNEL.replace("{visible}", visible).replace("{weights}", weights)


SOLUTIONS["fixed_window_kernel"] = window_kernel_with()
PLANTED["linus"]["fixed_window_kernel"] = (        # the classmate's kernel handed in unchanged
    window_kernel_with(weights=AGAINST_NEW_MAX),
    "q3_find_the_bug_window",
    "exp2(-inf - (-inf)) is NaN",
)
PLANTED["grace"]["fixed_window_kernel"] = (        # NaN mended, the window made one key wider
    window_kernel_with(visible=VISIBLE.replace("> position[:, None] - window", ">= position[:, None] - window")),
    "q3_find_the_bug_window",
    "Your window is one key too wide",
)
