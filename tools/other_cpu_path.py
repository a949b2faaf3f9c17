"""Print an ATEN_CPU_CAPABILITY other than this CPU's own, for `make test-other-cpu-path`.

    ATEN_CPU_CAPABILITY=$(.venv/bin/python tools/other_cpu_path.py) pytest ...

ATen, PyTorch's own CPU kernels (softmax, layer norm, GELU, reductions), picks a vectorised path by the CPU:
AVX-512 or AVX2 on x86-64. Another path rounds differently in the last bits, as another machine would, so the
training chapters and tests are run once more on one: AVX2 on an AVX-512 CPU, the scalar default on an AVX2
one. On a CPU that already runs the default path there is no other; the script says so on stderr and prints
"default".
"""

from __future__ import annotations

import sys

import torch

OTHER = {"AVX512": "avx2", "AVX2": "default"}


def main() -> int:
    own = torch.backends.cpu.get_cpu_capability()
    other = OTHER.get(own, "default")
    if own not in OTHER:
        print(f"other_cpu_path: this CPU's ATen path is {own}; no other to compare with, using 'default'",
              file=sys.stderr)
    print(other)
    return 0


if __name__ == "__main__":
    sys.exit(main())
