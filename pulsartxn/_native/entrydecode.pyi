from collections.abc import Sequence
from typing import Any

import numpy as np

from .entryformat import DecodedEntries, EntryHeader

def decode_header(buf: Any, verify: bool = True) -> EntryHeader: ...
def decode_entries(
    entry_ids: Any, buffers: Sequence[Any], verify: bool = True
) -> DecodedEntries: ...
def header_columns(
    buffers: Sequence[Any],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]: ...
