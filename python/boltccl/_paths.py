"""Files the wheel ships beside the extension module."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

MPI_LIBRARY = "libboltccl_mpi.dylib" if sys.platform == "darwin" else "libboltccl_mpi.so"


def mpi_library() -> Optional[Path]:
    """libboltccl_mpi in this package, or None if the wheel was built without it."""
    p = Path(__file__).resolve().parent / MPI_LIBRARY
    return p if p.is_file() else None
