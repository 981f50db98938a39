"""ComfyUI's `comfy.comfy_types` typing helpers for V1 nodes: `IO` (socket type names),
`ComfyNodeABC`, `InputTypeDict` and friends, `CheckLazyMixin`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from enum import Enum
from typing import Any, Literal, NotRequired, TypedDict


class StrEnum(str, Enum):
    def __str__(self) -> str:
        return self.value


class IO(StrEnum):
    """Socket type names. Comparisons follow ComfyUI's link rule: `*` matches anything, and a
    comma-joined name matches any of its parts."""

    STRING = "STRING"
    IMAGE = "IMAGE"
    MASK = "MASK"
    LATENT = "LATENT"
    BOOLEAN = "BOOLEAN"
    INT = "INT"
    FLOAT = "FLOAT"
    COMBO = "COMBO"
    CONDITIONING = "CONDITIONING"
    SAMPLER = "SAMPLER"
    SIGMAS = "SIGMAS"
    GUIDER = "GUIDER"
    NOISE = "NOISE"
    CLIP = "CLIP"
    CONTROL_NET = "CONTROL_NET"
    VAE = "VAE"
    MODEL = "MODEL"
    LORA_MODEL = "LORA_MODEL"
    LOSS_MAP = "LOSS_MAP"
    CLIP_VISION = "CLIP_VISION"
    CLIP_VISION_OUTPUT = "CLIP_VISION_OUTPUT"
    STYLE_MODEL = "STYLE_MODEL"
    GLIGEN = "GLIGEN"
    UPSCALE_MODEL = "UPSCALE_MODEL"
    AUDIO = "AUDIO"
    WEBCAM = "WEBCAM"
    POINT = "POINT"
    FACE_ANALYSIS = "FACE_ANALYSIS"
    BBOX = "BBOX"
    SEGS = "SEGS"
    VIDEO = "VIDEO"
    ANY = "*"
    NUMBER = "FLOAT,INT"
    PRIMITIVE = "STRING,FLOAT,INT,BOOLEAN"

    def __ne__(self, value: object) -> bool:
        if self == "*" or value == "*":
            return False
        if not isinstance(value, str):
            return True
        return not ({t.strip() for t in self.value.split(",")} & {t.strip() for t in value.split(",")})

    __hash__ = str.__hash__


class RemoteInputOptions(TypedDict):
    route: str
    refresh_button: bool
    control_after_refresh: NotRequired[Literal["first", "last"]]
    timeout: NotRequired[int]
    max_retries: NotRequired[int]
    refresh: NotRequired[int]


class InputTypeOptions(TypedDict, total=False):
    default: Any
    defaultInput: bool
    forceInput: bool
    lazy: bool
    rawLink: bool
    tooltip: str
    min: float
    max: float
    step: float
    round: float
    label_on: str
    label_off: str
    multiline: bool
    placeholder: str
    dynamicPrompts: bool
    image_upload: bool
    image_folder: Literal["input", "output", "temp"]
    remote: RemoteInputOptions
    control_after_generate: bool
    options: list


class HiddenInputTypeDict(TypedDict, total=False):
    node_id: Literal["UNIQUE_ID"]
    unique_id: Literal["UNIQUE_ID"]
    prompt: Literal["PROMPT"]
    extra_pnginfo: Literal["EXTRA_PNGINFO"]
    dynprompt: Literal["DYNPROMPT"]


class InputTypeDict(TypedDict, total=False):
    required: dict[str, tuple]
    optional: dict[str, tuple]
    hidden: HiddenInputTypeDict


class ComfyNodeABC(ABC):
    """The V1 node shape as an abstract base (class attributes ComfyUI reads)."""

    DESCRIPTION: str
    CATEGORY: str
    EXPERIMENTAL: bool
    DEPRECATED: bool

    @classmethod
    @abstractmethod
    def INPUT_TYPES(cls) -> InputTypeDict:
        """The node's inputs."""

    RETURN_TYPES: tuple
    RETURN_NAMES: tuple
    OUTPUT_TOOLTIPS: tuple
    FUNCTION: str
    OUTPUT_NODE: bool
    INPUT_IS_LIST: bool
    OUTPUT_IS_LIST: tuple


class CheckLazyMixin:
    """check_lazy_status that asks for every lazy input not evaluated yet."""

    def check_lazy_status(self, **kwargs: Any) -> list[str]:
        need = [name for name in kwargs if kwargs[name] is None]
        return need


class FileLocator(TypedDict):
    filename: str
    subfolder: str
    type: Literal["input", "output", "temp"]
