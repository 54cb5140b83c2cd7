"""The oldest torch that pe-bench runs on, checked where its models are built.

pyproject.toml declares it to pip too, but the GPU machines install pe-bench with
``--no-deps`` beside the torch they have, and a library user may import it into any
environment: there, an older torch fails deep inside a compile with an error that names
Inductor or Dynamo, not the release. Measured on this CPU with ``.ci/torch-compat`` (stop 60):
the suite passes under torch 2.11.0 and fails 68 tests under 2.10.0 (Dynamo cannot trace the
FlexAttention score_mods' coordinate indexing; Inductor's C++ kernels reject the bf16 casts'
``emulate_precision_casts``; torchaudio 2.11's kernels need torch 2.11).
"""

from __future__ import annotations

#: the oldest torch release the test suite passes under (major, minor)
MIN_TORCH = (2, 11)


def check_torch(version: str) -> None:
    """Raise ImportError naming ``version`` and the fix when it is older than ``MIN_TORCH``
    (``version`` as torch.__version__ spells it: "2.10.0+cu128", "2.12.0.dev20260301")."""
    try:
        major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:
        return  # a build whose version does not parse: let it run rather than guess
    if (major, minor) < MIN_TORCH:
        needed = ".".join(map(str, MIN_TORCH))
        raise ImportError(
            f"pe-bench needs torch >= {needed}; this environment has torch {version}, under which"
            f" its FlexAttention score_mods and bf16 compilation fail. Install a newer one:"
            f" pip install 'torch>={needed}' 'torchvision>=0.{MIN_TORCH[1] + 15}'"
        )
