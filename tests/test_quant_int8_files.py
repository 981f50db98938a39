"""ComfyUI mixed-precision files in the int8 and row / block-wise fp8 formats (as
silveroxides/convert_to_quant writes them), read by ``nodes/weights/quantized.py``: each layer
dequantises to exactly ``q * scale``, a model loaded from such a file (UNETLoader, checkpoint,
streamed within a small budget) computes exactly what the dequantised plain file computes, and
what is not read (ConvRot, nvfp4, a scale of the wrong shape, a group_size that does not tile the
weight) is refused by name."""

from __future__ import annotations

import json
import threading

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from mixgraph.graph.precision import Policy
from mixgraph.nodes.families.sd.unet import UNetModel
from mixgraph.nodes.models import loader, memory_budget
from mixgraph.nodes.weights import quantized, store, streaming
from mixgraph.nodes.weights.cast import apply_precision
from mixgraph.nodes.weights.gguf_tensor import is_quantized
from mixgraph.nodes.weights.safetensors_io import WeightSource, byte_ranges, quantization
from mixgraph.nodes.weights.store import WeightStore
from tests.fixtures import checkpoints as C
from tests.fixtures.tiny_unet import tiny_unet_config

F32, BF16, E4M3 = torch.float32, torch.bfloat16, torch.float8_e4m3fn
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(autouse=True)
def _fresh_budget(fresh_memory_budget):
    yield


# ---------------------------------------------------------------------------------------------
# quantising seeded weights as the converter does (absmax per tensor / row / 2-D block)


def _to_q(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.int8:
        return x.round().clamp(-127, 127).to(torch.int8)
    return x.to(dtype)


def _qmax(dtype: torch.dtype) -> float:
    return 127.0 if dtype == torch.int8 else torch.finfo(dtype).max


def quantise(w: torch.Tensor, fmt: str, group_size: int | None = None) -> tuple[torch.Tensor, ...]:
    """(q, scale as stored, the dequantised weight computed here independently: ``q * scale``)."""
    dtype = torch.int8 if fmt.startswith("int8") else E4M3
    m, n = w.shape
    if fmt in ("int8_tensorwise", "float8_e4m3fn"):
        s = (w.abs().amax() / _qmax(dtype)).float()
        q = _to_q(w / s, dtype)
        return q, s, q.float() * s
    if fmt in ("int8_rowwise_scale", "int8_rowwise_scale_m1", "float8_e4m3fn_rowwise"):  # per row: [M] / [M, 1]
        s = (w.abs().amax(dim=1) / _qmax(dtype)).float()
        q = _to_q(w / s[:, None], dtype)
        return q, (s[:, None] if fmt.endswith("_m1") else s), q.float() * s[:, None]
    b = group_size or {"int8_blockwise": 128, "float8_e4m3fn_blockwise": 64}[fmt]
    tiles = w.reshape(m // b, b, n // b, b)  # [M/B, B, N/B, B]
    s = (tiles.abs().amax(dim=(1, 3)) / _qmax(dtype)).float()  # [M/B, N/B]
    q = _to_q(tiles / s[:, None, :, None], dtype).reshape(m, n)
    ref = torch.empty(m, n)
    for i in range(m // b):
        for j in range(n // b):
            ref[i * b:(i + 1) * b, j * b:(j + 1) * b] = q[i * b:(i + 1) * b, j * b:(j + 1) * b].float() * s[i, j]
    return q, s, ref


def _marker(conf: dict) -> torch.Tensor:
    return torch.tensor(list(json.dumps(conf).encode("utf-8")), dtype=torch.uint8)


#: (format name in the file, how the test quantises it)
CASES = {
    "int8_tensorwise": ("int8_tensorwise", "int8_tensorwise"),
    "int8_tensorwise_per_row": ("int8_tensorwise", "int8_rowwise_scale"),
    "int8_tensorwise_per_row_m1": ("int8_tensorwise", "int8_rowwise_scale_m1"),
    "int8_blockwise": ("int8_blockwise", "int8_blockwise"),
    "float8_e4m3fn_rowwise": ("float8_e4m3fn_rowwise", "float8_e4m3fn_rowwise"),
    "float8_e4m3fn_blockwise": ("float8_e4m3fn_blockwise", "float8_e4m3fn_blockwise"),
}


def quantised_sd(sd: dict, layers, case: str, group_size: int | None = None, where: str = "marker",
                 prefix: str = "") -> tuple[dict, dict, dict | None]:
    """(file tensors, dequantised reference, header metadata) of ``sd`` with ``layers``' weights in
    the case's format; configs as ``comfy_quant`` tensors or in the header (``where``)."""
    fmt, how = CASES[case]
    out, ref, confs = dict(sd), dict(sd), {}
    for layer in layers:
        q, s, r = quantise(sd[f"{layer}.weight"], how, group_size)
        out[f"{layer}.weight"], out[f"{layer}.weight_scale"], ref[f"{layer}.weight"] = q, s, r
        out[f"{layer}.input_scale"] = torch.tensor(0.25)  # read past (never applied)
        conf = {"format": fmt, "full_precision_matrix_mult": True}
        if group_size is not None:
            conf["group_size"] = group_size
        confs[prefix + layer] = conf
        if where == "marker":
            out[f"{layer}.comfy_quant"] = _marker(conf)
    meta = {quantized.QUANT_METADATA: json.dumps({"layers": confs})} if where == "metadata" else None
    return out, ref, meta


# ---------------------------------------------------------------------------------------------
# a model of no family, its sides multiples of 128 (the int8 block default)


class Wide(nn.Module):
    def __init__(self, config=None):
        super().__init__()
        self.inp = nn.Linear(128, 128)
        self.norm = nn.LayerNorm(128)
        self.blocks = nn.ModuleList([nn.Linear(128, 256), nn.Linear(256, 128, bias=False)])
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.out = nn.Linear(128, 128)

    def forward(self, x, img):
        h = self.norm(self.inp(x))
        h = h + self.blocks[1](torch.nn.functional.gelu(self.blocks[0](h)))
        return self.out(h), self.conv(img)


WIDE_LAYERS = ["inp", "blocks.0", "blocks.1", "out"]


def _wide_file(tmp_path, case, group_size=None, where="marker"):
    torch.manual_seed(0)
    sd = {k: v.detach().clone() for k, v in Wide().state_dict().items()}
    q, ref, meta = quantised_sd(sd, WIDE_LAYERS, case, group_size, where)
    path = tmp_path / f"wide_{case}_{group_size}_{where}.safetensors"
    save_file(q, str(path), metadata=meta)
    return WeightSource.from_file(path), ref


def _wide_run(module, policy):
    g = torch.Generator().manual_seed(1)
    x, img = torch.randn(2, 3, 128, generator=g), torch.randn(1, 2, 6, 6, generator=g)
    with torch.no_grad():
        return apply_precision(module, policy)(x, img)


@pytest.mark.parametrize("where", ["marker", "metadata"])
@pytest.mark.parametrize("case,group_size", [
    ("int8_tensorwise", None), ("int8_tensorwise_per_row", None), ("int8_tensorwise_per_row_m1", None),
    ("int8_blockwise", None), ("int8_blockwise", 32), ("float8_e4m3fn_rowwise", None),
    ("float8_e4m3fn_blockwise", None), ("float8_e4m3fn_blockwise", 16)])
def test_layers_dequantise_to_q_times_scale(tmp_path, case, group_size, where):
    source, ref = _wide_file(tmp_path, case, group_size, where)
    assert set(quantization(source).layers) == {f"{k}.weight" for k in WIDE_LAYERS}
    m = WeightStore().materialize("wide", source, None, F32, (), Wide)
    got = m.state_dict()
    assert set(got) == set(ref)
    for k, v in ref.items():
        assert got[k].dtype == F32 and torch.equal(got[k], v), k
    plain = Wide()
    plain.load_state_dict(ref)
    for a, b in zip(_wide_run(m, Policy()), _wide_run(plain.eval(), Policy())):
        assert torch.equal(a, b)


def test_block_scale_with_the_same_count_is_read_row_major(tmp_path):
    """A block scale stored flat ([M/B * N/B]) means the [M/B, N/B] grid, row-major."""
    torch.manual_seed(0)
    sd = {k: v.detach().clone() for k, v in Wide().state_dict().items()}
    q, ref, _ = quantised_sd(sd, WIDE_LAYERS, "int8_blockwise", 32)
    q = {k: v.reshape(-1) if k.endswith(".weight_scale") else v for k, v in q.items()}
    save_file(q, str(tmp_path / "flat.safetensors"))
    m = WeightStore().materialize("wide", WeightSource.from_file(tmp_path / "flat.safetensors"), None, F32, (), Wide)
    for k in WIDE_LAYERS:
        assert torch.equal(m.state_dict()[f"{k}.weight"], ref[f"{k}.weight"])


@pytest.mark.parametrize("case", ["int8_tensorwise", "int8_tensorwise_per_row", "int8_blockwise"])
def test_int8_layers_stay_int8_in_memory_whatever_the_storage_dtype(tmp_path, case):
    """An int8 layer is held as int8 (a QuantizedTensor of `int8_format`: per block a float32
    scale, then the values) under any storage dtype, a quarter of its f32 bytes and a little;
    it dequantises to exactly q * scale, cast to the dtype asked for."""
    block = 32 if "block" in case else None
    source, ref = _wide_file(tmp_path, case, block)
    for storage in (F32, BF16, E4M3):
        s = WeightStore()
        m = s.materialize("wide", source, None, storage, (), Wide)
        for k in WIDE_LAYERS:
            w = m.get_submodule(k).weight
            assert is_quantized(w) and w.fmt.name.startswith("int8x") and not hasattr(m.get_submodule(k), "weight_scale")
            assert w.raw.numel() == quantized.int8_kept_bytes(tuple(w.shape), block) < w.numel() * 2
            assert torch.equal(w.dequantize(), ref[f"{k}.weight"]), k
            assert torch.equal(w.dequantize(BF16), ref[f"{k}.weight"].to(BF16)), k
        assert s.stats.bytes < sum(ref[f"{k}.weight"].numel() for k in WIDE_LAYERS) * 2


@pytest.mark.parametrize("case", ["float8_e4m3fn_blockwise"])
def test_dequantised_layers_take_the_storage_dtype(tmp_path, case):
    """Block-wise fp8 layers are dequantised in f32 then cast to the storage dtype, fp8
    included (no scale is kept for them)."""
    source, ref = _wide_file(tmp_path, case, 32 if "block" in case else None)
    for storage in (BF16, E4M3):
        s = WeightStore()
        m = s.materialize("wide", source, None, storage, (), Wide)
        for k in WIDE_LAYERS:
            lin = m.get_submodule(k)
            assert not hasattr(lin, "weight_scale")
            assert lin.weight.dtype == storage and torch.equal(lin.weight, ref[f"{k}.weight"].to(storage)), k
        assert torch.equal(quantized.plain_state_dict(m)["inp.weight"], ref["inp.weight"].to(storage))
        assert quantized.dequantized(s.state_dict("wide", source, None, storage)) is not None


def test_rowwise_fp8_stays_fp8_with_its_row_scale_under_fp8_storage(tmp_path):
    source, ref = _wide_file(tmp_path, "float8_e4m3fn_rowwise")
    m = WeightStore().materialize("wide", source, None, E4M3, (), Wide)
    for k in WIDE_LAYERS:
        lin = m.get_submodule(k)
        assert lin.weight.dtype == E4M3 and lin.weight_scale.shape == (lin.weight.shape[0], 1)
        assert torch.equal(lin.weight.float() * lin.weight_scale, ref[f"{k}.weight"])
    plain = quantized.plain_state_dict(m)
    assert all(torch.equal(plain[f"{k}.weight"], ref[f"{k}.weight"]) for k in WIDE_LAYERS)
    saved = quantized.module_state_dict(m)
    assert saved["inp.weight"].dtype == E4M3 and saved["inp.weight_scale"].numel() == 128


# ---------------------------------------------------------------------------------------------
# refusals


def _one_layer_file(tmp_path, weight, scale, conf, extra=None):
    sd = {"lin.weight": weight, "lin.weight_scale": scale, "lin.comfy_quant": _marker(conf), **(extra or {})}
    path = tmp_path / "one.safetensors"
    save_file(sd, str(path))

    class One(nn.Module):
        def __init__(self, config=None):
            super().__init__()
            self.lin = nn.Linear(weight.shape[1], weight.shape[0], bias=False)

    return lambda: WeightStore().materialize("one", WeightSource.from_file(path), None, F32, (), One)


def test_convrot_is_refused_by_name(tmp_path):
    q, s, _ = quantise(torch.randn(128, 128), "int8_blockwise")
    load = _one_layer_file(tmp_path, q, s, {"format": "int8_blockwise", "group_size": 128, "convrot": True,
                                            "convrot_groupsize": 256})
    msg = r"lin\.weight: 'int8_blockwise' layers with \"convrot\": true .* not supported yet"
    with pytest.raises(NotImplementedError, match=msg):
        load()


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8", "int4_awq"])
def test_other_formats_are_refused_by_name(tmp_path, fmt):
    load = _one_layer_file(tmp_path, torch.zeros(4, 8, dtype=torch.uint8), torch.ones(4, 1), {"format": fmt},
                           {"lin.weight_scale_2": torch.tensor(1.0)})
    with pytest.raises(NotImplementedError, match=rf"'{fmt}' quantised layers are not supported yet"):
        load()


@pytest.mark.parametrize("fmt,weight,scale,expected", [
    ("int8_tensorwise", torch.zeros(8, 16, dtype=torch.int8), torch.ones(16), "one per tensor or per output row"),
    ("float8_e4m3fn_rowwise", torch.zeros(8, 16, dtype=E4M3), torch.tensor(1.0), "one per output row"),
    ("int8_blockwise", torch.zeros(32, 64, dtype=torch.int8), torch.ones(2, 1), r"\[2, 4\]: one per 16x16 block"),
    ("float8_e4m3fn_blockwise", torch.zeros(32, 64, dtype=E4M3), torch.ones(4, 2), r"\[2, 4\]: one per 16x16 block"),
])
def test_scale_of_the_wrong_shape_names_key_and_shapes(tmp_path, fmt, weight, scale, expected):
    load = _one_layer_file(tmp_path, weight, scale, {"format": fmt, "group_size": 16})
    msg = (rf"lin\.weight_scale: a scale of shape {list(scale.shape)} for a weight of shape "
           rf"{list(weight.shape)}").replace("[", r"\[")
    with pytest.raises(ValueError, match=msg + r".*" + expected):
        load()


@pytest.mark.parametrize("conf", [{"format": "int8_blockwise", "group_size": 48},
                                  {"format": "int8_blockwise"},  # default 128 does not divide 64
                                  {"format": "float8_e4m3fn_blockwise", "group_size": 24}])
def test_group_size_that_does_not_tile_the_weight_is_refused(tmp_path, conf):
    dtype = torch.int8 if conf["format"].startswith("int8") else E4M3
    load = _one_layer_file(tmp_path, torch.zeros(64, 96, dtype=dtype), torch.ones(1), conf)
    size = conf.get("group_size", 128)
    msg = rf"lin\.weight: a '{conf['format']}' weight of shape \[64, 96\] is not tiled by group_size {size}"
    with pytest.raises(ValueError, match=msg):
        load()


def test_weight_of_another_dtype_than_the_format_is_refused(tmp_path):
    load = _one_layer_file(tmp_path, torch.zeros(8, 16, dtype=torch.float16), torch.tensor(1.0),
                           {"format": "int8_tensorwise"})
    with pytest.raises(ValueError, match=r"lin\.weight: a torch\.float16 weight in a 'int8_tensorwise' layer"):
        load()


# ---------------------------------------------------------------------------------------------
# the SD UNet fixture through UNETLoader / CheckpointLoaderSimple, resident and streamed


def _linear_layers(sd: dict) -> list[str]:
    return sorted(k[: -len(".weight")] for k, v in sd.items() if k.endswith(".weight") and v.ndim == 2)


UNET_CASES = [("int8_tensorwise", None), ("int8_tensorwise_per_row", None), ("int8_blockwise", 16),
              ("float8_e4m3fn_rowwise", None), ("float8_e4m3fn_blockwise", 16)]


@pytest.fixture(scope="module")
def unet_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("int8_unet")
    sd = C.write_unet(d / "plain.safetensors", "sd15", seed=3)
    layers = _linear_layers(sd)  # every Linear (sides multiples of 16), time_embed's keep-f32 ones too
    for case, group in UNET_CASES:
        q, ref, _ = quantised_sd(sd, layers, case, group)
        save_file(q, str(d / f"{case}.safetensors"))
        save_file({k: v.contiguous() for k, v in ref.items()}, str(d / f"{case}_dequantised.safetensors"))
    return d


def _unet_out(handle, policy, stream=None):
    module = store.materialize("unet", handle.source, handle.config, policy.storage, (), UNetModel, stream=stream)
    cfg = tiny_unet_config("sd15")
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, cfg.in_channels, 8, 8, generator=g)
    ctx = torch.randn(2, 4, cfg.context_dim, generator=g)
    with torch.no_grad():
        return apply_precision(module, policy)(x, torch.tensor([500.0, 20.0]), ctx), streaming.is_streamed(module)


@pytest.mark.parametrize("case", [c for c, _ in UNET_CASES])
def test_unetloader_file_equals_the_dequantised_file(unet_files, case):
    got = loader.load_unet(unet_files / f"{case}.safetensors")
    ref = loader.load_unet(unet_files / f"{case}_dequantised.safetensors")
    assert got.kind == "sd1" and got.config == ref.config and quantization(got.source) is not None
    a, _ = _unet_out(got, Policy())
    store.clear()
    b, _ = _unet_out(ref, Policy())
    assert torch.equal(a, b)


def _write_checkpoints(folder, case, group_size) -> None:
    """``q.safetensors``: an SD1.5 checkpoint whose UNet Linears are quantised, their configs in
    the header under their prefixed names (as the converter writes them for a checkpoint);
    ``plain.safetensors``: the same checkpoint dequantised."""
    ckpt = C.sd15_state_dict(seed=4)
    unet = {k[len(C.UNET_PREFIX):]: v for k, v in ckpt.items() if k.startswith(C.UNET_PREFIX)}
    q, ref, meta = quantised_sd(unet, _linear_layers(unet), case, group_size, "metadata", C.UNET_PREFIX)
    rest = {k: v for k, v in ckpt.items() if not k.startswith(C.UNET_PREFIX)}
    folder.mkdir(parents=True, exist_ok=True)
    save_file({**rest, **C.with_prefix(C.UNET_PREFIX, q)}, str(folder / "q.safetensors"), metadata=meta)
    save_file({**rest, **C.with_prefix(C.UNET_PREFIX, {k: v.contiguous() for k, v in ref.items()})},
              str(folder / "plain.safetensors"))


@pytest.mark.parametrize("case,group_size", [("int8_blockwise", 16), ("float8_e4m3fn_rowwise", None)])
def test_checkpoint_with_quantised_unet_and_header_configs(tmp_path, case, group_size):
    _write_checkpoints(tmp_path, case, group_size)
    got, clip, vae = loader.load_checkpoint(tmp_path / "q.safetensors")
    want, _, _ = loader.load_checkpoint(tmp_path / "plain.safetensors")
    assert clip is not None and vae is not None and got.config == want.config
    assert quantization(got.source) is not None and quantization(clip.encoders[0].source) is None
    a, _ = _unet_out(got, Policy())
    store.clear()
    b, _ = _unet_out(want, Policy())
    assert torch.equal(a, b)


def _join_prefetch():
    for t in threading.enumerate():
        if t.name == "mixgraph-stream-prefetch":
            t.join(timeout=10)


@pytest.mark.parametrize("case", ["int8_tensorwise_per_row", "int8_blockwise", "float8_e4m3fn_blockwise",
                                  "float8_e4m3fn_rowwise"])
def test_streamed_within_a_small_budget_equals_the_dequantised_file(unet_files, case, monkeypatch):
    """Over a small budget the model streams its blocks; each unit's read brings its layers'
    scales along (read through the store's path, and asked for ahead by the prefetch); the output
    equals the dequantised plain file's resident run exactly."""
    handle = loader.load_unet(unet_files / f"{case}.safetensors")
    plain = loader.load_unet(unet_files / f"{case}_dequantised.safetensors")
    policy = Policy(F32, F32, False, True, False)
    want, was = _unet_out(plain, policy, stream=False)
    assert not was
    store.clear()
    with torch.device("meta"):
        meta = UNetModel(handle.config)
    units, fixed = streaming.units_of(meta, store.dtype_rule(meta), policy.storage)
    asked = []
    monkeypatch.setattr(store, "will_need", lambda path, ranges: asked.append(tuple(ranges)))
    monkeypatch.setenv(streaming.PREFETCH_ENV, "1")
    b = memory_budget.set_budget("cpu", (fixed + sum(u.nbytes for u in units)) // 2
                                 / (1 - streaming.WORK_SHARE) / memory_budget.GIB)
    before = streaming.snapshot()
    got, was = _unet_out(handle, policy)
    _join_prefetch()
    cost = streaming.since(before)
    assert was and torch.equal(got, want)
    assert cost["bytes_streamed"] > 0 and cost["peak_weight_bytes"] <= streaming.weights_allowance(b)
    # every unit streamed (none kept resident): the prefetch asked for ranges that hold each layer's scale
    store.clear()
    asked.clear()
    memory_budget.set_budget("cpu", 8, mode="none")
    got, _ = _unet_out(handle, policy)
    _join_prefetch()
    assert torch.equal(got, want)
    unit = units[1].name + "."
    scales = [k for k in quantization(handle.source).aux if k.startswith(unit) and k.endswith(".weight_scale")]
    assert scales
    spans = [r for ranges in asked for r in ranges]
    for k in scales:
        ((lo, n),) = byte_ranges(handle.source, lambda key, k=k: key == k)
        assert any(a <= lo and lo + n <= a + m for a, m in spans), k


def test_estimate_counts_an_int8_checkpoint_at_the_bytes_kept(tmp_path):
    """``mixgraph estimate`` counts an int8 file's int8 layers at the bytes the store keeps for
    them (``int8_kept_bytes``), the rest as for the dequantised plain file, under f32 and bf16."""
    from mixgraph.nodes.weights.safetensors_io import held_quantised
    from mixgraph.graph.env import Env
    from mixgraph.ui import api
    from mixgraph.ui.estimate import estimate

    models = tmp_path / "models"
    _write_checkpoints(models / "checkpoints", "int8_tensorwise_per_row", None)
    reg, env = api.default_registry(), Env.from_args(models=str(models))
    for spec in ("f32", "bf16"):
        got = {}
        for name in ("q.safetensors", "plain.safetensors"):
            g = api.Graph()
            ck = g.add("CheckpointLoaderSimple", ckpt_name=name)
            pos = g.add("CLIPTextEncode", text="a cat", clip=ck[1])
            lat = g.add("EmptyLatentImage", width=64, height=64, batch_size=1)
            ks = g.add("KSampler", model=ck[0], positive=pos.out, negative=pos.out, latent_image=lat.out,
                       seed=1, steps=2, cfg=5.0, sampler_name="euler", scheduler="normal", denoise=1.0)
            g.add("PreviewImage", images=g.add("VAEDecode", samples=ks.out, vae=ck[2]).out)
            est = estimate(g.build(), reg, env, spec)
            got[name] = (est["nodes"][ks.node_id]["weights_bytes"], est["peak_bytes"])
        item = 4 if spec == "f32" else 2
        held = held_quantised(WeightSource.from_file(models / "checkpoints" / "q.safetensors"))
        unet = {k: v for k, v in held.items() if k.startswith("model.diffusion_model.")}
        assert unet and all(b < n * 2 for b, n in unet.values())
        saving = sum(n * item - b for b, n in unet.values())
        assert got["q.safetensors"][0] == got["plain.safetensors"][0] - saving > 0, spec
        assert got["q.safetensors"][1] <= got["plain.safetensors"][1], spec


def test_an_int8_file_that_fits_only_as_int8_stays_resident(unet_files):
    """The streaming plan counts an int8 layer at the bytes kept (``held_quantised``): under an
    allowance between the file's int8 footprint and its dense f32 one, the model stays resident,
    and gives the dequantised file's output exactly."""
    from mixgraph.nodes.weights.safetensors_io import held_quantised

    handle = loader.load_unet(unet_files / "int8_tensorwise_per_row.safetensors")
    plain = loader.load_unet(unet_files / "int8_tensorwise_per_row_dequantised.safetensors")
    policy = Policy(F32, F32, False, True, False)
    want, _ = _unet_out(plain, policy, stream=False)
    store.clear()
    with torch.device("meta"):
        meta = UNetModel(handle.config)
    rule = store.dtype_rule(meta)
    units, fixed = streaming.units_of(meta, rule, F32)
    kept_units, kept_fixed = streaming.units_of(meta, rule, F32,
                                                {k: b for k, (b, _n) in held_quantised(handle.source).items()})
    dense, kept = fixed + sum(u.nbytes for u in units), kept_fixed + sum(u.nbytes for u in kept_units)
    assert kept < 0.9 * dense  # the tiny UNet: its Linears are a quarter of its bytes
    b = memory_budget.set_budget("cpu", (kept + dense) / 2 / (1 - streaming.WORK_SHARE) / memory_budget.GIB)
    assert kept <= streaming.weights_allowance(b) < dense
    got, was = _unet_out(handle, policy)
    assert not was and torch.equal(got, want)
