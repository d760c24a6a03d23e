"""DCP's checkpoint reader and load planner, made unable to run code: `.metadata` is unpickled
admitting only the classes DCP's metadata is made of (`METADATA_CLASSES`), each non-tensor value
is read by `torch.load(weights_only=True)`; anything else is refused, named, before it runs."""

from __future__ import annotations

import collections
import importlib
import io
import pathlib
import pickle
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from streamback.errors import StreambackError

# The torch releases this reader has run on (2.11 on an H200, 2.13 on the CPU): pyproject.toml's range.
TESTED_TORCH = ">=2.11,<2.14"
# torch's private names the reader needs (module, attribute path): another release may lack one.
PRIVATE_TORCH_NAMES = (
    ("torch.distributed.checkpoint._traverse", "set_element"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.distributed.checkpoint.filesystem", "FileSystemReader._get_metadata_path"),
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),
    ("torch.serialization", "_get_layout"),
)


def check_torch_names(names=PRIVATE_TORCH_NAMES) -> None:
    """Nothing if this torch has every name of `names`; else StreambackError, one line naming the
    torch version, the first missing name and the tested range (before any work: at import)."""
    for module_name, attribute in names:
        try:
            found = importlib.import_module(module_name)
            for part in attribute.split("."):
                found = getattr(found, part)
        except (ImportError, AttributeError):
            raise StreambackError(
                f"torch {torch.__version__} has no {module_name}.{attribute}, which streamback's checkpoint reader "
                f"needs: install torch{TESTED_TORCH} (the releases streamback is tested on)"
            ) from None


check_torch_names()

from torch.distributed.checkpoint import filesystem as dcp_filesystem  # noqa: E402 (after the check)
from torch.distributed.checkpoint import metadata as dcp_metadata  # noqa: E402
from torch.distributed.checkpoint._traverse import set_element  # noqa: E402

# (module, name) -> object: everything a DCP `.metadata` pickle may name. DCP's dataclasses, the
# storage index of its FileSystemWriter, the checkpoint id (a path), torch.Size, a tensor's
# layout (by its name) and dtypes; the containers are pickle's own opcodes, not classes.
METADATA_CLASSES = {
    **{
        ("torch.distributed.checkpoint.metadata", name): getattr(dcp_metadata, name)
        for name in (
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "ChunkStorageMetadata",
            "TensorProperties",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "_MEM_FORMAT_ENCODING",
        )
    },
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): dcp_filesystem._StorageInfo,
    ("pathlib", "PosixPath"): pathlib.PosixPath,
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,
    ("collections", "OrderedDict"): collections.OrderedDict,
    **{("torch", name): value for name, value in vars(torch).items() if isinstance(value, torch.dtype)},
}


class UnsafeCheckpoint(StreambackError):
    """A checkpoint file that names something other than what a checkpoint is made of."""


class MetadataUnpickler(pickle.Unpickler):
    """Unpickles a DCP `.metadata`, refusing any global outside METADATA_CLASSES."""

    def find_class(self, module: str, name: str):
        try:
            return METADATA_CLASSES[module, name]
        except KeyError:
            raise pickle.UnpicklingError(f"{module}.{name}") from None


class SafeFileSystemReader(dcp.FileSystemReader):
    """DCP's file reader, with `.metadata` read through MetadataUnpickler."""

    def read_metadata(self, *args, **kwargs) -> dcp_metadata.Metadata:
        path = Path(self._get_metadata_path(kwargs.get("rank")))
        metadata = read_dcp_metadata(path)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def read_dcp_metadata(path: Path) -> dcp_metadata.Metadata:
    """DCP's `.metadata` file at `path`, unpickled by MetadataUnpickler; UnsafeCheckpoint naming
    the file and the global it names if it names one outside METADATA_CLASSES."""
    with open(path, "rb") as f:
        try:
            metadata = MetadataUnpickler(f).load()
        except pickle.UnpicklingError as err:
            raise UnsafeCheckpoint(
                f"checkpoint file {path} tries to load {err}, which is not one of the classes DCP's metadata "
                "is made of: refused unread (a checkpoint file that names it may run code)"
            ) from None
    if not isinstance(metadata, dcp_metadata.Metadata):
        raise UnsafeCheckpoint(f"checkpoint file {path} holds a {type(metadata).__name__}, not DCP's Metadata")
    return metadata


class SafeLoadPlanner(dcp.DefaultLoadPlanner):
    """DCP's load planner, with each non-tensor value read by `torch.load(weights_only=True)`
    (DCP's own uses weights_only=False, which runs what the file names)."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as err:
            raise UnsafeCheckpoint(
                f"the value {read_item.dest_index.fqn} of the checkpoint is not plain data, refused unread: "
                f"{str(err).splitlines()[0]}"
            ) from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj
