"""The V3 node schema (`comfy_api.latest.io`): `ComfyNode`, `Schema`, the input/output types,
`Hidden`, `NodeOutput`. A ComfyNode also answers the V1 attributes (INPUT_TYPES, RETURN_TYPES,
FUNCTION, OUTPUT_NODE...) from its schema, as ComfyUI's does, so mixgraph's adapter reads V1 and
V3 classes the same way. The dynamic sockets (`MatchType`, `Autogrow`, `DynamicCombo`) only
record their declaration here; the adapter translates them onto mixgraph's engine."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from comfy_execution.graph_utils import ExecutionBlocker


class FolderType(str, Enum):
    input = "input"
    output = "output"
    temp = "temp"


class UploadType(str, Enum):
    image = "image_upload"
    audio = "audio_upload"
    video = "video_upload"
    model = "file_upload"


class NumberDisplay(str, Enum):
    number = "number"
    slider = "slider"


def _prune(d: dict) -> dict:
    return {k: v for k, v in d.items() if v is not None}


class Input:
    """An input of a V3 node; `as_dict()` is its V1 options dict."""

    io_type = "*"

    def __init__(self, id: str, display_name: str | None = None, optional: bool = False,
                 tooltip: str | None = None, lazy: bool | None = None,
                 extra_dict: dict | None = None, raw_link: bool | None = None, **_: Any):
        self.id, self.display_name, self.optional = id, display_name, optional
        self.tooltip, self.lazy, self.raw_link = tooltip, lazy, raw_link
        self.extra_dict = extra_dict or {}

    def get_io_type(self) -> str:
        return self.io_type

    def as_dict(self) -> dict:
        return _prune({"display_name": self.display_name, "tooltip": self.tooltip,
                       "lazy": self.lazy, "rawLink": self.raw_link}) | _prune(self.extra_dict)


class WidgetInput(Input):
    def __init__(self, id: str, display_name: str | None = None, optional: bool = False,
                 tooltip: str | None = None, lazy: bool | None = None, default: Any = None,
                 socketless: bool | None = None, force_input: bool | None = None,
                 extra_dict: dict | None = None, raw_link: bool | None = None, **kw: Any):
        super().__init__(id, display_name, optional, tooltip, lazy, extra_dict, raw_link)
        self.default, self.socketless, self.force_input = default, socketless, force_input
        self.options_extra = _prune({k: (v.value if isinstance(v, Enum) else v) for k, v in kw.items()
                                     if k not in ("display_mode",)})
        if kw.get("display_mode") is not None:
            self.options_extra["display"] = getattr(kw["display_mode"], "value", kw["display_mode"])

    def as_dict(self) -> dict:
        return super().as_dict() | _prune({"default": self.default, "socketless": self.socketless,
                                           "forceInput": self.force_input}) | self.options_extra


class Output:
    io_type = "*"

    def __init__(self, id: str | None = None, display_name: str | None = None,
                 tooltip: str | None = None, is_output_list: bool = False, **_: Any):
        self.id, self.display_name, self.tooltip = id, display_name, tooltip
        self.is_output_list = is_output_list


def comfytype(io_type: str, **_: Any):
    """Class decorator: a type with nested `Input` / `Output` classes bound to `io_type`."""

    def decorate(cls):
        cls.io_type = io_type
        base_in = cls.__dict__.get("Input", getattr(cls, "Input", Input))
        base_out = cls.__dict__.get("Output", getattr(cls, "Output", Output))
        cls.Input = type("Input", (base_in,), {"io_type": io_type, "__module__": cls.__module__})
        cls.Output = type("Output", (base_out,), {"io_type": io_type, "__module__": cls.__module__})
        return cls

    return decorate


class ComfyTypeIO:
    Input = Input
    Output = Output


def Custom(io_type: str) -> type:
    """A type for a socket name of the pack's own."""

    @comfytype(io_type)
    class CustomType(ComfyTypeIO):
        pass

    return CustomType


def _link_type(io_type: str) -> type:
    return comfytype(io_type)(type(io_type.title().replace("_", ""), (ComfyTypeIO,), {}))


@comfytype("BOOLEAN")
class Boolean(ComfyTypeIO):
    class Input(WidgetInput):
        pass


@comfytype("INT")
class Int(ComfyTypeIO):
    class Input(WidgetInput):
        def __init__(self, id: str, display_name=None, optional=False, tooltip=None, lazy=None,
                     default=None, min=None, max=None, step=None, control_after_generate=None,
                     display_mode=None, socketless=None, force_input=None, extra_dict=None,
                     raw_link=None):
            super().__init__(id, display_name, optional, tooltip, lazy, default, socketless,
                             force_input, extra_dict, raw_link, min=min, max=max, step=step,
                             control_after_generate=control_after_generate,
                             display_mode=display_mode)


@comfytype("FLOAT")
class Float(ComfyTypeIO):
    class Input(WidgetInput):
        def __init__(self, id: str, display_name=None, optional=False, tooltip=None, lazy=None,
                     default=None, min=None, max=None, step=None, round=None, display_mode=None,
                     socketless=None, force_input=None, extra_dict=None, raw_link=None):
            super().__init__(id, display_name, optional, tooltip, lazy, default, socketless,
                             force_input, extra_dict, raw_link, min=min, max=max, step=step,
                             round=round, display_mode=display_mode)


@comfytype("STRING")
class String(ComfyTypeIO):
    class Input(WidgetInput):
        def __init__(self, id: str, display_name=None, optional=False, tooltip=None, lazy=None,
                     multiline=False, placeholder=None, default=None, dynamic_prompts=None,
                     socketless=None, force_input=None, extra_dict=None, raw_link=None):
            super().__init__(id, display_name, optional, tooltip, lazy, default, socketless,
                             force_input, extra_dict, raw_link, multiline=multiline or None,
                             placeholder=placeholder, dynamicPrompts=dynamic_prompts)


@comfytype("COMBO")
class Combo(ComfyTypeIO):
    class Input(WidgetInput):
        def __init__(self, id: str, options=None, display_name=None, optional=False, tooltip=None,
                     lazy=None, default=None, control_after_generate=None, upload=None,
                     image_folder=None, remote=None, socketless=None, extra_dict=None,
                     raw_link=None):
            if isinstance(options, type) and issubclass(options, Enum):
                options = [v.value for v in options]
            if isinstance(default, Enum):
                default = default.value
            extra = {"control_after_generate": control_after_generate,
                     "image_folder": getattr(image_folder, "value", image_folder)}
            if upload is not None:
                extra[getattr(upload, "value", upload)] = True
            super().__init__(id, display_name, optional, tooltip, lazy, default, socketless,
                             None, extra_dict, raw_link, **extra)
            self.options = list(options or [])

        def as_dict(self) -> dict:
            return super().as_dict() | {"options": self.options}


@comfytype("*")
class AnyType(ComfyTypeIO):
    pass


class MultiType:
    class Input(Input):
        def __init__(self, id, types: list, display_name=None, optional=False, tooltip=None,
                     lazy=None, extra_dict=None, raw_link=None):
            super().__init__(id if isinstance(id, str) else id.id, display_name, optional,
                             tooltip, lazy, extra_dict, raw_link)
            self.types = [t.io_type if hasattr(t, "io_type") else str(t) for t in types]

        def get_io_type(self) -> str:
            return ",".join(self.types)


def _type_names(types: Any) -> list[str]:
    """Socket type names of one type class / name or a list of them."""
    items = types if isinstance(types, (list, tuple)) else [types]
    return [t.io_type if hasattr(t, "io_type") else str(t) for t in items]


class _DynamicInput(Input):
    """A dynamic socket (MatchType / Autogrow / DynamicCombo): the adapter translates it onto
    mixgraph's engine declarations (graph/dynamic.py); `dynamic_kind` tells which."""

    dynamic_kind = ""


@comfytype("COMFY_MATCHTYPE_V3")
class MatchType(ComfyTypeIO):
    """Sockets sharing a `Template` take whatever one type is connected to them."""

    class Template:
        def __init__(self, template_id: str, allowed_types: Any = None):
            self.template_id = template_id
            self.allowed_types = _type_names(allowed_types) if allowed_types is not None else ["*"]

        def as_dict(self) -> dict:
            return {"template_id": self.template_id, "allowed_types": ",".join(self.allowed_types)}

    class Input(_DynamicInput):
        dynamic_kind = "match"

        def __init__(self, id: str, template: "MatchType.Template", display_name=None,
                     optional=False, tooltip=None, lazy=None, extra_dict=None, raw_link=None):
            super().__init__(id, display_name, optional, tooltip, lazy, extra_dict, raw_link)
            self.template = template

        def as_dict(self) -> dict:
            return super().as_dict() | {"template": self.template.as_dict()}

    class Output(Output):
        def __init__(self, template: "MatchType.Template", id: str | None = None,
                     display_name: str | None = None, tooltip: str | None = None,
                     is_output_list: bool = False):
            super().__init__(id, display_name, tooltip, is_output_list)
            self.template = template


class Autogrow(ComfyTypeIO):
    """An input that grows a member socket per connection: `TemplatePrefix` names them
    `<prefix>0..<prefix>{max-1}`, `TemplateNames` from a list. `execute` gets one dict."""

    io_type = "COMFY_AUTOGROW_V3"
    Type = dict

    class TemplatePrefix:
        def __init__(self, input: Input, prefix: str, min: int = 1, max: int = 10):
            self.input, self.prefix, self.min, self.max = input, prefix, min, max

    class TemplateNames:
        def __init__(self, input: Input, names: list, min: int = 1):
            self.input, self.names, self.min = input, list(names), min

    class Input(_DynamicInput):
        io_type = "COMFY_AUTOGROW_V3"
        dynamic_kind = "autogrow"

        def __init__(self, id: str, template: Any, display_name=None, optional=False,
                     tooltip=None, lazy=None, extra_dict=None):
            super().__init__(id, display_name, optional, tooltip, lazy, extra_dict)
            self.template = template


class DynamicCombo(ComfyTypeIO):
    """A combo whose chosen `Option` brings its own inputs; `execute` gets one dict
    `{<input id>: key, <sub id>: value, ...}`."""

    io_type = "COMFY_DYNAMICCOMBO_V3"
    Type = dict

    class Option:
        def __init__(self, key: str, inputs: list):
            self.key, self.inputs = key, list(inputs)

    class Input(_DynamicInput):
        io_type = "COMFY_DYNAMICCOMBO_V3"
        dynamic_kind = "dynamic_combo"

        def __init__(self, id: str, options: list, display_name=None, optional=False,
                     tooltip=None, lazy=None, extra_dict=None):
            super().__init__(id, display_name, optional, tooltip, lazy, extra_dict)
            self.options = list(options)


Image = _link_type("IMAGE")
Mask = _link_type("MASK")
Latent = _link_type("LATENT")
Conditioning = _link_type("CONDITIONING")
Sampler = _link_type("SAMPLER")
Sigmas = _link_type("SIGMAS")
Noise = _link_type("NOISE")
Guider = _link_type("GUIDER")
Clip = _link_type("CLIP")
ControlNet = _link_type("CONTROL_NET")
Vae = _link_type("VAE")
Model = _link_type("MODEL")
ClipVision = _link_type("CLIP_VISION")
ClipVisionOutput = _link_type("CLIP_VISION_OUTPUT")
StyleModel = _link_type("STYLE_MODEL")
Gligen = _link_type("GLIGEN")
UpscaleModel = _link_type("UPSCALE_MODEL")
Audio = _link_type("AUDIO")
Video = _link_type("VIDEO")
LoraModel = _link_type("LORA_MODEL")
Webcam = _link_type("WEBCAM")


class Hidden(str, Enum):
    unique_id = "UNIQUE_ID"
    prompt = "PROMPT"
    extra_pnginfo = "EXTRA_PNGINFO"
    dynprompt = "DYNPROMPT"
    auth_token_comfy_org = "AUTH_TOKEN_COMFY_ORG"
    api_key_comfy_org = "API_KEY_COMFY_ORG"


class HiddenHolder:
    """`cls.hidden` during `execute`: the hidden inputs the schema asked for (None otherwise)."""

    def __init__(self, values: dict[str, Any]):
        self.unique_id = values.get("UNIQUE_ID")
        self.prompt = values.get("PROMPT")
        self.extra_pnginfo = values.get("EXTRA_PNGINFO")
        self.dynprompt = values.get("DYNPROMPT")
        self.auth_token_comfy_org = values.get("AUTH_TOKEN_COMFY_ORG")
        self.api_key_comfy_org = values.get("API_KEY_COMFY_ORG")

    def __getattr__(self, key: str) -> None:
        return None

    @classmethod
    def from_dict(cls, d: dict | None) -> "HiddenHolder":
        return cls({str(getattr(k, "value", k)): v for k, v in (d or {}).items()})


@dataclass
class Schema:
    node_id: str
    display_name: str | None = None
    category: str = "sd"
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    hidden: list = field(default_factory=list)
    description: str = ""
    is_input_list: bool = False
    is_output_node: bool = False
    is_deprecated: bool = False
    is_experimental: bool = False
    is_api_node: bool = False
    not_idempotent: bool = False
    enable_expand: bool = False
    search_aliases: list = field(default_factory=list)

    def finalize(self) -> None:
        """Output nodes get PROMPT and EXTRA_PNGINFO; outputs without ids get ones."""
        self.inputs, self.outputs, self.hidden = self.inputs or [], self.outputs or [], list(self.hidden or [])
        if self.is_output_node:
            for h in (Hidden.prompt, Hidden.extra_pnginfo):
                if h not in self.hidden:
                    self.hidden.append(h)
        for i, o in enumerate(self.outputs):
            if o.id is None:
                o.id = f"_{i}_{o.io_type}_"

    def validate(self) -> None:
        ids = [i.id for i in self.inputs]
        outs = [o.id for o in self.outputs]
        problems = []
        if len(set(ids)) != len(ids):
            problems.append(f"Input ids must be unique: {ids}")
        if len(set(outs)) != len(outs):
            problems.append(f"Output ids must be unique: {outs}")
        if set(ids) & set(outs):
            problems.append(f"Ids must be unique between inputs and outputs: {set(ids) & set(outs)}")
        if problems:
            raise ValueError("\n".join(problems))

    def v1_inputs(self) -> dict:
        out: dict[str, dict] = {"required": {}}
        for i in self.inputs:
            opts = i.as_dict()
            out.setdefault("optional" if i.optional else "required", {})[i.id] = (i.get_io_type(), opts)
        for h in self.hidden:
            h = Hidden(h)
            out.setdefault("hidden", {})[h.name] = (h.value,)
        return out


class classproperty:
    def __init__(self, fn):
        self.fn = fn

    def __get__(self, obj, owner):
        return self.fn(owner)


class NodeOutput:
    def __init__(self, *args: Any, ui: Any = None, expand: dict | None = None,
                 block_execution: str | None = None):
        self.args, self.ui, self.expand, self.block_execution = args, ui, expand, block_execution

    @property
    def result(self):
        return self.args if self.args else None

    @classmethod
    def from_dict(cls, data: dict) -> "NodeOutput":
        result = data.get("result", ())
        if isinstance(result, ExecutionBlocker):
            return cls(block_execution=result.message)
        return cls(*result, ui=data.get("ui"), expand=data.get("expand"))

    def __getitem__(self, index: int) -> Any:
        return self.args[index]


class ComfyNode:
    """Base of V3 nodes: `define_schema()` and `execute(**inputs)` (classmethods); optional
    `validate_inputs`, `fingerprint_inputs`, `check_lazy_status`."""

    _COMFY_BASE = True
    _HIDDEN_HOLDER = HiddenHolder
    hidden: HiddenHolder | None = None
    SCHEMA: Schema | None = None
    RELATIVE_PYTHON_MODULE: str | None = None

    @classmethod
    def define_schema(cls) -> Schema:
        raise NotImplementedError(f"{cls.__name__} defines no define_schema")

    @classmethod
    def execute(cls, **kwargs: Any) -> NodeOutput:
        raise NotImplementedError(f"{cls.__name__} defines no execute")

    @classmethod
    def validate_inputs(cls, **kwargs: Any) -> bool | str:
        raise NotImplementedError

    @classmethod
    def fingerprint_inputs(cls, **kwargs: Any) -> Any:
        raise NotImplementedError

    @classmethod
    def check_lazy_status(cls, **kwargs: Any) -> list[str]:
        return [name for name, value in kwargs.items() if value is None]

    @classmethod
    def GET_SCHEMA(cls) -> Schema:
        schema = cls.define_schema()
        schema.finalize()
        schema.validate()
        cls.SCHEMA = schema
        return schema

    @classmethod
    def _schema(cls) -> Schema:
        if cls.__dict__.get("SCHEMA") is None:
            cls.GET_SCHEMA()
        return cls.SCHEMA

    @classmethod
    def INPUT_TYPES(cls) -> dict:
        return cls._schema().v1_inputs()

    @classproperty
    def FUNCTION(cls) -> str:  # noqa: N802
        return "EXECUTE_NORMALIZED_ASYNC" if inspect.iscoroutinefunction(cls.execute) \
            else "EXECUTE_NORMALIZED"

    @classproperty
    def RETURN_TYPES(cls):  # noqa: N802
        return tuple(o.io_type for o in cls._schema().outputs)

    @classproperty
    def RETURN_NAMES(cls):  # noqa: N802
        return tuple(o.display_name or o.io_type for o in cls._schema().outputs)

    @classproperty
    def OUTPUT_IS_LIST(cls):  # noqa: N802
        return tuple(bool(o.is_output_list) for o in cls._schema().outputs)

    @classproperty
    def OUTPUT_TOOLTIPS(cls):  # noqa: N802
        tips = [o.tooltip for o in cls._schema().outputs]
        return tips if any(tips) else None

    @classproperty
    def CATEGORY(cls):  # noqa: N802
        return cls._schema().category

    @classproperty
    def DESCRIPTION(cls):  # noqa: N802
        return cls._schema().description

    @classproperty
    def OUTPUT_NODE(cls):  # noqa: N802
        return cls._schema().is_output_node

    @classproperty
    def INPUT_IS_LIST(cls):  # noqa: N802
        return cls._schema().is_input_list

    @classproperty
    def DEPRECATED(cls):  # noqa: N802
        return cls._schema().is_deprecated

    @classproperty
    def EXPERIMENTAL(cls):  # noqa: N802
        return cls._schema().is_experimental

    @classmethod
    def _normalized(cls, ret: Any) -> NodeOutput:
        if ret is None:
            ret = NodeOutput()
        elif isinstance(ret, tuple):
            ret = NodeOutput(*ret)
        elif isinstance(ret, dict):
            ret = NodeOutput.from_dict(ret)
        elif isinstance(ret, ExecutionBlocker):
            ret = NodeOutput(block_execution=ret.message)
        elif not isinstance(ret, NodeOutput):
            raise TypeError(f"Invalid return type from node {cls.__name__}: {type(ret).__name__}")
        if ret.expand is not None and not cls._schema().enable_expand:
            raise ValueError(f"Node {cls.__name__} is not expandable, but expand included in "
                             f"NodeOutput; set enable_expand=True on the node's Schema")
        return ret

    @classmethod
    def EXECUTE_NORMALIZED(cls, **kwargs: Any) -> NodeOutput:  # noqa: N802
        return cls._normalized(cls.execute(**kwargs))

    @classmethod
    async def EXECUTE_NORMALIZED_ASYNC(cls, **kwargs: Any) -> NodeOutput:  # noqa: N802
        return cls._normalized(await cls.execute(**kwargs))


__all__ = ["FolderType", "UploadType", "NumberDisplay", "comfytype", "Custom", "Input",
           "WidgetInput", "Output", "ComfyTypeIO", "Boolean", "Int", "Float", "String", "Combo",
           "Image", "Mask", "Latent", "Conditioning", "Sampler", "Sigmas", "Noise", "Guider",
           "Clip", "ControlNet", "Vae", "Model", "ClipVision", "ClipVisionOutput", "StyleModel",
           "Gligen", "UpscaleModel", "Audio", "Video", "LoraModel", "Webcam", "AnyType",
           "MultiType", "MatchType", "Autogrow", "DynamicCombo", "Hidden", "HiddenHolder", "Schema", "ComfyNode", "NodeOutput"]
