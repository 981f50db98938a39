"""Qwen-Image's text-encoder set ("qwen_image": Qwen2.5-VL 7B, slot "qwen25_7b"): its tokenizer
("qwen_image": the prompt templates, weights off, images in the prompt), its join (the template's
tokens dropped) and the encoder architecture "qwen2_5_vl" (a file's keys -> config, module).

ComfyUI facts (``comfy/text_encoders/qwen_image.py``, ``sd1_clip.py``, ``comfy/sd.py``):

* CLIPLoader type "qwen_image" loads ``qwen_2.5_vl_7b(_fp8_scaled).safetensors``
  (``detect_te_model``: ``model.layers.0.self_attn.k_proj.bias``, 512 wide for the 7B).
* Tokenizer (``QwenImageTokenizer``): the Qwen2.5 BPE, pad 151643, no start / end token, at least
  one token, weights *disabled*. The prompt goes into ``TEMPLATE`` (``TEMPLATE_IMAGES`` when images
  are given, or the caller's ``llama_template``), except a prompt that starts with
  ``<|im_start|>`` or ``<|start_header_id|>``, which is taken as written. Each ``<|image_pad|>``
  token (151655), in order, becomes the next image given.
* Text model (``Qwen25_7BVLIModel``): ``layer="last"``: the output of the final norm (CLIPSetLastLayer
  -n: decoder layer L - n, unnormed), attention masks on.
* Set (``QwenImageTEModel.encode_token_weights``): ``template_end`` is the index (in the first
  chunk's token list, an image counting as one item) of the second ``<|im_start|>`` (151644), or of
  the only one; when the two tokens after it are ``user`` (872) and ``\\n`` (198), it moves past
  them (only if the output has more than ``template_end + 3`` tokens). The output keeps tokens
  ``template_end:`` (with no ``<|im_start|>`` at all: ``-1:``, the last token) and so does the
  attention mask, which the cond carries as ``attention_mask`` only when one of its tokens is 0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import Tensor

from mixgraph.nodes.encoders import llm_tokenizers
from mixgraph.nodes.encoders.encoder_set import EncodedText, OutputRule, register_join, register_tokenizer
from mixgraph.nodes.encoders.llm_sets import LlmFound
from mixgraph.nodes.encoders.qwen25_vl import ImageEmbed, Qwen25VLConfig, is_qwen25, qwen25_vl_config
from mixgraph.nodes.encoders.tokenizer import EmbeddingLookup
from mixgraph.nodes.payloads.conditioning import Cond

__all__ = ["QWEN_IMAGE", "QWEN25_7B", "QWEN25_VL_RULE", "TEMPLATE", "TEMPLATE_IMAGES", "EDIT_PLUS_TEMPLATE",
           "IM_START", "IMAGE_PAD", "QwenImageTokenizer", "template_end", "qwen_image_join", "find_qwen25_vl",
           "qwen25_vl_arch_config", "QWEN25_VL_PREFIXES", "entry_tokenizer"]

QWEN_IMAGE = "qwen_image"  # the set (ClipHandle.kind) and its tokenizer
QWEN25_7B = "qwen25_7b"  # the encoder (slot) name
IM_START, USER, NEWLINE, IMAGE_PAD = 151644, 872, 198, 151655
#: ComfyUI's Qwen25_7BVLIModel: the last layer after the final norm, no pooled output
QWEN25_VL_RULE = OutputRule(pad_token=llm_tokenizers.QWEN_PAD, default_layer=None, norm_hidden=False,
                            project_pooled=False)

TEMPLATE = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
            "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
            "<|im_start|>assistant\n")
_EDIT_SYSTEM = ("<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, "
                "objects, background), then explain how the user's text instruction should alter or modify the "
                "image. Generate a new image that meets the user's requirements while maintaining consistency "
                "with the original input where appropriate.<|im_end|>\n<|im_start|>user\n")
TEMPLATE_IMAGES = _EDIT_SYSTEM + "<|vision_start|><|image_pad|><|vision_end|>{}<|im_end|>\n<|im_start|>assistant\n"
#: TextEncodeQwenImageEditPlus's llama_template (its "Picture N:" image markers are in the prompt)
EDIT_PLUS_TEMPLATE = _EDIT_SYSTEM + "{}<|im_end|>\n<|im_start|>assistant\n"


class QwenImageTokenizer:
    """ComfyUI's ``QwenImageTokenizer`` (see the module docstring). ``accepts_images``: the
    Edit nodes may pass ``images`` (IMAGE tensors) and a ``llama_template``."""

    accepts_images = True
    start_token = None

    def __init__(self) -> None:
        self._qwen = llm_tokenizers.QwenTokenizer(weights=False)
        self.vocab_size = self._qwen.vocab_size

    def encode(self, text: str) -> list[int]:
        return self._qwen.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self._qwen.decode(ids)

    def prompt_text(self, text: str, images: int = 0, llama_template: str | None = None) -> str:
        """The text tokenized for `text`: the template around it, unless it starts a chat itself."""
        if text.startswith("<|im_start|>") or text.startswith("<|start_header_id|>"):
            return text
        if llama_template is not None:
            return llama_template.format(text)
        return (TEMPLATE_IMAGES if images else TEMPLATE).format(text)

    def tokenize_with_weights(self, text: str, *, pad_token: int = llm_tokenizers.QWEN_PAD,
                              embedding_lookup: EmbeddingLookup | None = None, embedding_key: str = QWEN25_7B,
                              warn: Callable[[str], None] | None = None, word_ids: bool = False,
                              min_length: int | None = None, images: Sequence[Tensor] = (),
                              llama_template: str | None = None) -> list[list[tuple]]:
        """One chunk of (token | ImageEmbed, weight[, word id]); the k-th ``<|image_pad|>`` holds
        the k-th of `images` (the ones beyond the image tokens are unused, as in ComfyUI)."""
        chunks = self._qwen.tokenize_with_weights(
            self.prompt_text(text, len(images), llama_template), pad_token=pad_token,
            embedding_lookup=embedding_lookup, embedding_key=embedding_key, warn=warn, word_ids=word_ids,
            min_length=min_length)
        pending = list(images)
        for chunk in chunks:
            for i, item in enumerate(chunk):
                if pending and isinstance(item[0], int) and item[0] == IMAGE_PAD:
                    chunk[i] = (ImageEmbed(pending.pop(0)),) + tuple(item[1:])
        return chunks


def template_end(tokens: Sequence[Any], n_out: int) -> int:
    """Where Qwen-Image's output starts (ComfyUI's ``QwenImageTEModel.encode_token_weights``):
    `tokens` the first chunk's items, `n_out` the output's token count; -1 when there is no
    ``<|im_start|>`` (the output keeps its last token only, as ComfyUI's slice does)."""
    end, seen = -1, 0
    for i, t in enumerate(tokens):
        if isinstance(t, int) and t == IM_START and seen < 2:
            end, seen = i, seen + 1
    if n_out > end + 3 and _is(tokens, end + 1, USER) and _is(tokens, end + 2, NEWLINE):
        end += 3
    return end


def _is(tokens: Sequence[Any], i: int, value: int) -> bool:
    return 0 <= i < len(tokens) and isinstance(tokens[i], int) and tokens[i] == value


def qwen_image_join(outputs: Mapping[str, EncodedText]) -> Cond:
    """The cond of the "qwen_image" set: the hidden states from ``template_end`` on; their
    ``attention_mask`` (int64 [1, T]) only when it masks a token."""
    if QWEN25_7B not in outputs:
        raise ValueError(f"the qwen_image text-encoder set needs {QWEN25_7B!r}; it got {', '.join(outputs) or 'none'}")
    out = outputs[QWEN25_7B]
    start = template_end(out.tokens, out.hidden.shape[1])
    hidden = out.hidden[:, start:]
    inputs = {}
    if out.mask is not None:
        mask = out.mask[:, start:].long()
        if int(mask.sum()) != mask.numel():
            inputs["attention_mask"] = mask
    return Cond(cross_attn=hidden.float().clone(), pooled=None, model_inputs=inputs)


register_join(QWEN_IMAGE, qwen_image_join)
register_tokenizer(QWEN_IMAGE, QwenImageTokenizer)


# --------------------------------------------------------------------------------------------
# the architecture "qwen2_5_vl" in the shape ``encoder_arch.register_arch`` takes

#: standalone files (ComfyUI's qwen_2.5_vl_7b), or a checkpoint's ``text_encoders.qwen25_7b.transformer.``
QWEN25_VL_PREFIXES = ("", f"text_encoders.{QWEN25_7B}.transformer.")


def _shape(v: Any) -> tuple[int, ...]:
    return tuple(getattr(v, "shape", v))


def find_qwen25_vl(info: Mapping[str, Any], prefix: str) -> LlmFound | None:
    """Where `info` keeps a Qwen2.5(-VL) decoder under `prefix`, or None."""
    if not is_qwen25(info, prefix):
        return None
    return LlmFound("qwen2_5_vl", prefix, "ldm", _shape(info[prefix + "model.embed_tokens.weight"])[1])


def qwen25_vl_arch_config(info: Mapping[str, Any], found: Any, slot: str) -> Qwen25VLConfig:
    p = found.prefix
    return qwen25_vl_config({k[len(p):]: _shape(v) for k, v in info.items() if k.startswith(p)})


def entry_tokenizer(source: Any, slot_tokenizer: str) -> str:
    """The tokenizer an entry of these weights reads: the slot's, except that the bare vocabulary
    "qwen2.5" means ComfyUI's Qwen-Image prompt layer ("qwen_image": template, weights off,
    images), the only set ComfyUI loads this encoder for."""
    return QWEN_IMAGE if slot_tokenizer == "qwen2.5" else slot_tokenizer
