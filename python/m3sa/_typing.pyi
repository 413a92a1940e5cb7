# Types for the stubs only (as typeshed's _typeshed): m3sa._typing does not exist at run time, so
# import from it under `if TYPE_CHECKING:` only.
from typing import Protocol, Union

from typing_extensions import Buffer, CapsuleType, TypeAlias

class SupportsDLPack(Protocol):
    """A DLPack producer: numpy arrays, torch tensors, and any other array with __dlpack__."""

    def __dlpack__(self) -> object: ...

# What m3sa._core's array arguments take (nanobind's nb::ndarray): a DLPack producer, a DLPack
# capsule (torch.utils.dlpack.to_dlpack), or a buffer-protocol object. The dtype, shape, device and
# writability are checked at run time (README.md, "Python").
Array: TypeAlias = Union[SupportsDLPack, CapsuleType, Buffer]
