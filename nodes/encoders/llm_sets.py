"""The text-encoder sets of the decoder-LLM families: Z-Image ("z_image": Qwen3-4B) and Lumina 2
("lumina2": Gemma 2 2B); their joins, prompt templates, output rules, and the two encoder
architectures ("qwen3", "gemma2": recognise a file from its keys, config from shapes, build, the
entry's tokenizer).

ComfyUI facts (``comfy/text_encoders/z_image.py``, ``lumina2.py``, ``comfy/sd.py``,
``comfy_extras/nodes_lumina2.py``):

* Both load with CLIPLoader type "lumina2"; ``detect_te_model`` tells the file: Gemma 2 has
  ``model.layers.0.post_feedforward_layernorm.weight`` (and no ``q_norm``, which is Gemma 3);
  Qwen3 has ``post_attention_layernorm`` and ``self_attn.q_norm`` (2560 wide: Qwen3-4B).
* Qwen3-4B (``Qwen3_4BModel``): pad 151643 (``<|endoftext|>``), no start/end token, hidden layer
  -2 unnormed, attention masks on. Its set tokenizer (``ZImageTokenizer``) puts the prompt in the
  chat template ``<|im_start|>user\\n{}<|im_end|>\\n<|im_start|>assistant\\n`` with weights
  disabled: our tokenizer "z_image" (``llm_tokenizers``).
* Gemma 2 2B (``Gemma2_2BModel``): start 2 (``<bos>``), pad 0, hidden layer -2 unnormed,
  attention masks on; weights on; no template for CLIPTextEncode. CLIPTextEncodeLumina2 prefixes
  one of two system prompts: ``f"{system_prompt} <Prompt Start> {user_prompt}"``
  (``lumina2_prompt``).
* The cond: the hidden states ``[1, T, D]`` (padding kept) and ``attention_mask`` ``[1, T]``
  (int64, 1 = token) in ``model_inputs``; no pooled vector. The families read the mask
  (ComfyUI's ``Lumina2.extra_conds``: ``num_tokens`` and the mask when it has zeros).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from mixgraph.nodes.encoders import llm_tokenizers
from mixgraph.nodes.encoders.encoder_set import EncodedText, EncoderEntry, OutputRule, register_join
from mixgraph.nodes.encoders.gemma2 import Gemma2TextModel, gemma2_config, is_gemma2
from mixgraph.nodes.encoders.qwen3 import Qwen3TextModel, is_qwen3, qwen3_config
from mixgraph.nodes.payloads.conditioning import Cond
from mixgraph.nodes.weights.safetensors_io import WeightSource, inspect_file

__all__ = ["Z_IMAGE", "LUMINA2", "QWEN3_4B", "GEMMA2_2B", "QWEN3_RULE", "GEMMA2_RULE", "LUMINA2_SYSTEM_PROMPTS",
           "lumina2_prompt", "LlmArch", "LLM_ARCHS", "source_shapes", "llm_entry",
           "decoder_join", "entry_tokenizer", "LLM_PREFIXES", "LlmFound", "find_qwen3", "find_gemma2",
           "qwen3_arch_config", "gemma2_arch_config"]

Z_IMAGE, LUMINA2 = "z_image", "lumina2"  # set names (ClipHandle.kind)
QWEN3_4B, GEMMA2_2B = "qwen3_4b", "gemma2_2b"  # encoder names (slots, embedding keys)

QWEN3_RULE = OutputRule(pad_token=llm_tokenizers.QWEN_PAD, default_layer=-2, norm_hidden=False, project_pooled=False)
GEMMA2_RULE = OutputRule(pad_token=0, default_layer=-2, norm_hidden=False, project_pooled=False)

LUMINA2_SYSTEM_PROMPTS = {
    "superior": "You are an assistant designed to generate superior images with the superior degree of "
                "image-text alignment based on textual prompts or user prompts.",
    "alignment": "You are an assistant designed to generate high-quality images with the highest degree of "
                 "image-text alignment based on textual prompts.",
}


def lumina2_prompt(system_prompt: str, user_prompt: str) -> str:
    """CLIPTextEncodeLumina2's text: the named system prompt, ``<Prompt Start>``, the user's."""
    if system_prompt not in LUMINA2_SYSTEM_PROMPTS:
        raise ValueError(f"Lumina 2 system prompt {system_prompt!r}: one of {', '.join(LUMINA2_SYSTEM_PROMPTS)}")
    return f"{LUMINA2_SYSTEM_PROMPTS[system_prompt]} <Prompt Start> {user_prompt}"


# --------------------------------------------------------------------------------------------
# joins


def decoder_join(name: str) -> Callable[[Mapping[str, EncodedText]], Cond]:
    """The join of a one-encoder decoder-LLM set: that encoder's tokens, its attention mask in
    ``model_inputs["attention_mask"]`` (int64 [1, T], as ComfyUI's cond carries it)."""

    def join(outputs: Mapping[str, EncodedText]) -> Cond:
        if name not in outputs:
            raise ValueError(f"this text-encoder set needs {name!r}; it got {', '.join(outputs) or 'none'}")
        out = outputs[name]
        inputs = {} if out.mask is None else {"attention_mask": out.mask.long()}
        return Cond(cross_attn=out.hidden.float(), pooled=None, model_inputs=inputs)

    join.__qualname__ = f"decoder_join[{name}]"
    return join


register_join(Z_IMAGE, decoder_join(QWEN3_4B))
register_join(LUMINA2, decoder_join(GEMMA2_2B))


# --------------------------------------------------------------------------------------------
# architectures


@dataclass(frozen=True)
class LlmArch:
    """An encoder architecture: ``recognise(shapes)`` from prefix-stripped key -> shape,
    ``config(shapes)``, ``build(config)``, and ``tokenizer(source, slot_tokenizer)`` -> the
    name the entry reads (Gemma: the file's own SentencePiece model; Qwen3: the slot's)."""

    name: str
    recognise: Callable[[Mapping[str, tuple[int, ...]]], bool]
    config: Callable[[Mapping[str, tuple[int, ...]]], Any]
    build: Callable[[Any], nn.Module]
    tokenizer: Callable[[WeightSource, str], str]


LLM_ARCHS = {
    "qwen3": LlmArch("qwen3", is_qwen3, qwen3_config, Qwen3TextModel, lambda source, slot: slot),
    "gemma2": LlmArch("gemma2", is_gemma2, gemma2_config, Gemma2TextModel,
                      lambda source, slot: llm_tokenizers.gemma_tokenizer_name(source)),
}


def entry_tokenizer(arch: str, source: WeightSource, slot_tokenizer: str) -> str:
    """The tokenizer name an entry of architecture `arch` in `source` reads: the file's own for
    Gemma 2 (registered on the way), else the slot's (Z-Image: "z_image")."""
    spec = LLM_ARCHS.get(arch)
    return slot_tokenizer if spec is None else spec.tokenizer(source, slot_tokenizer)


# --------------------------------------------------------------------------------------------
# the same, in the shape of an architecture registry that finds an encoder under a prefix:
# ``find(info, prefix) -> LlmFound | None`` and ``config(info, found, slot_name)``, where `info`
# maps the file's keys as stored to tensors, TensorInfo or shapes

#: where files keep them: standalone (ComfyUI's qwen_3_4b / gemma_2_2b), or in a single-file
#: checkpoint under ComfyUI's ``text_encoders.<name>.transformer.``
LLM_PREFIXES = {"qwen3": ("", f"text_encoders.{QWEN3_4B}.transformer."),
                "gemma2": ("", f"text_encoders.{GEMMA2_2B}.transformer.")}


@dataclass(frozen=True)
class LlmFound:
    """Where a file keeps a decoder-LLM encoder: architecture, key prefix, layout (keys as
    stored: "ldm"), hidden width."""

    arch: str
    prefix: str
    layout: str
    width: int


def _shape(v: Any) -> tuple[int, ...]:
    return tuple(getattr(v, "shape", v))


def _shapes(info: Mapping[str, Any], prefix: str) -> dict[str, tuple[int, ...]]:
    return {k[len(prefix):]: _shape(v) for k, v in info.items() if k.startswith(prefix)}


def _finder(arch: str) -> Callable[[Mapping[str, Any], str], LlmFound | None]:
    def find(info: Mapping[str, Any], prefix: str) -> LlmFound | None:
        embed = info.get(prefix + "model.embed_tokens.weight")
        if embed is None or not LLM_ARCHS[arch].recognise({k[len(prefix):] for k in info if k.startswith(prefix)}):
            return None
        return LlmFound(arch, prefix, "ldm", _shape(embed)[1])

    find.__qualname__ = f"find_{arch}"
    return find


def _arch_config(arch: str) -> Callable[[Mapping[str, Any], Any, str], Any]:
    def config(info: Mapping[str, Any], found: Any, slot: str) -> Any:
        return LLM_ARCHS[arch].config(_shapes(info, found.prefix))

    config.__qualname__ = f"{arch}_config"
    return config


find_qwen3, find_gemma2 = _finder("qwen3"), _finder("gemma2")
qwen3_arch_config, gemma2_arch_config = _arch_config("qwen3"), _arch_config("gemma2")


def source_shapes(source: WeightSource) -> dict[str, tuple[int, ...]]:
    """key (prefix stripped) -> shape of `source`'s tensors, from the header only."""
    p = source.prefix
    if source.path is None:
        items = ((k, tuple(v.shape)) for k, v in (source.tensors or {}).items())
    else:
        items = ((k, tuple(info.shape)) for k, info in inspect_file(source.path).items())
    return {k[len(p):]: s for k, s in items if k.startswith(p)}


def llm_entry(arch: str, source: WeightSource, name: str, tokenizer: str, rule: OutputRule,
              role: str = "text") -> EncoderEntry:
    """The ``EncoderEntry`` of a decoder-LLM encoder in `source` (``arch`` "qwen3" | "gemma2");
    ValueError when the weights are not that architecture."""
    spec = LLM_ARCHS.get(arch)
    if spec is None:
        raise ValueError(f"encoder architecture {arch!r}: not a decoder LLM here ({', '.join(LLM_ARCHS)})")
    shapes = source_shapes(source)
    if not spec.recognise(shapes):
        raise ValueError(f"{source.name}: the {name} text encoder is not a {arch} model (keys under "
                         f"{source.prefix!r} do not match)")
    return EncoderEntry(name=name, source=source, config=spec.config(shapes), rule=rule,
                        tokenizer=spec.tokenizer(source, tokenizer), role=role, build=spec.build)
