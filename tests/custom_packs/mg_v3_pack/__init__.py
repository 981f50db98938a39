"""A ComfyUI V3 custom node pack (comfy_api.latest)."""

from comfy_api.latest import ComfyExtension, io, ui


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


class MgExtension(ComfyExtension):
    async def get_node_list(self):
        return [MgV3Multiply, MgV3Latent]


async def comfy_entrypoint():
    return MgExtension()
