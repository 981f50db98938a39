"""A ComfyUI V3 custom node pack (comfy_api.latest)."""

from comfy_api.latest import ComfyExtension, io, ui
from comfy_execution.graph_utils import GraphBuilder

CALLS = {"always": 0}


class MgV3Multiply(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="MgV3Multiply", display_name="Multiply (mg V3)", category="mg/v3",
            description="value * factor, as text too",
            inputs=[io.Int.Input("value", default=2, min=0, max=100, tooltip="the value"),
                    io.Float.Input("factor", default=1.5, min=0.0, max=10.0, step=0.5),
                    io.Combo.Input("mode", options=["int", "float"], default="float")],
            outputs=[io.Float.Output(display_name="product"), io.String.Output("text")],
            hidden=[io.Hidden.unique_id], is_output_node=True)

    @classmethod
    def validate_inputs(cls, value):
        return True if value != 13 else "13 is unlucky"

    @classmethod
    def fingerprint_inputs(cls, value, factor, mode):
        return f"{value}/{factor}/{mode}"

    @classmethod
    def execute(cls, value, factor, mode):
        product = value * factor
        if mode == "int":
            product = float(int(product))
        text = f"{cls.hidden.unique_id}:{product}"
        return io.NodeOutput(product, text, ui=ui.PreviewText(text))


class MgV3Latent(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(node_id="MgV3Latent", category="mg/v3",
                         inputs=[io.Latent.Input("latent"), io.Mask.Input("mask", optional=True)],
                         outputs=[io.Latent.Output()])

    @classmethod
    async def execute(cls, latent, mask=None):
        return io.NodeOutput({"samples": latent["samples"] * 0.5})


class MgV3Loop(io.ComfyNode):
    """A V3 while loop built by expansion: while n > 0, append "+" (MgAppendText, V1 pack)."""

    @classmethod
    def define_schema(cls):
        return io.Schema(node_id="MgV3Loop", category="mg/v3", enable_expand=True,
                         inputs=[io.String.Input("text", default="v"),
                                 io.Int.Input("n", default=2, min=0, max=1000)],
                         outputs=[io.String.Output()])

    @classmethod
    def execute(cls, text, n):
        if n <= 0:
            return io.NodeOutput(text)
        graph = GraphBuilder()
        step = graph.node("MgAppendText", text=text, suffix="+")
        again = graph.node("MgV3Loop", text=step.out(0), n=n - 1)
        return io.NodeOutput(again.out(0), expand=graph.finalize())


class MgV3Always(io.ComfyNode):
    """fingerprint_inputs gives NaN: never a cache hit, it runs in every prompt."""

    @classmethod
    def define_schema(cls):
        return io.Schema(node_id="MgV3Always", category="mg/v3", is_output_node=True,
                         inputs=[io.Int.Input("value", default=1)],
                         outputs=[io.Int.Output()])

    @classmethod
    def fingerprint_inputs(cls, value):
        return float("nan")

    @classmethod
    def execute(cls, value):
        CALLS["always"] += 1
        return io.NodeOutput(value + 1, ui={"value": [value + 1]})


class MgExtension(ComfyExtension):
    async def get_node_list(self):
        return [MgV3Multiply, MgV3Latent, MgV3Loop, MgV3Always]


async def comfy_entrypoint():
    return MgExtension()
