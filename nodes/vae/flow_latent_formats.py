"""The 16-channel latent formats of the Flux / SD3 autoencoders, shared by the families that
sample in them (ComfyUI ``comfy/latent_formats.py``: ``SD3``, ``Flux``).

Both are a shift then a scale: ``process_in(z) = (z − shift)·scale`` and ``process_out(x) =
x / scale + shift``, written here as a per-channel affine format with ``mean = shift`` and
``std = 1`` (``latent_format.LatentFormat``). SD3 / SD3.5 use SD3's VAE statistics; Flux.1,
Chroma, Z-Image and Lumina 2 use the Flux autoencoder's. The preview factors are ComfyUI's
(rows: latent channels; columns: R, G, B).
"""

from __future__ import annotations

from mixgraph.nodes.vae.latent_format import LatentFormat

__all__ = ["SD3_LATENT", "FLUX_LATENT", "shifted_format"]

CHANNELS = 16

SD3_RGB_FACTORS = ((-0.0922, -0.0175, 0.0749), (0.0311, 0.0633, 0.0954), (0.1994, 0.0927, 0.0458),
                   (0.0856, 0.0339, 0.0902), (0.0587, 0.0272, -0.0496), (-0.0006, 0.1104, 0.0309),
                   (0.0978, 0.0306, 0.0427), (-0.0042, 0.1038, 0.1358), (-0.0194, 0.0020, 0.0669),
                   (-0.0488, 0.0130, -0.0268), (0.0922, 0.0988, 0.0951), (-0.0278, 0.0524, -0.0542),
                   (0.0332, 0.0456, 0.0895), (-0.0069, -0.0030, -0.0810), (-0.0596, -0.0465, -0.0293),
                   (-0.1448, -0.1463, -0.1189))
SD3_RGB_BIAS = (0.2394, 0.2135, 0.1925)

FLUX_RGB_FACTORS = ((-0.0346, 0.0244, 0.0681), (0.0034, 0.0210, 0.0687), (0.0275, -0.0668, -0.0433),
                    (-0.0174, 0.0160, 0.0617), (0.0859, 0.0721, 0.0329), (0.0004, 0.0383, 0.0115),
                    (0.0405, 0.0861, 0.0915), (-0.0236, -0.0185, -0.0259), (-0.0245, 0.0250, 0.1180),
                    (0.1008, 0.0755, -0.0421), (-0.0515, 0.0201, 0.0011), (0.0428, -0.0012, -0.0036),
                    (0.0817, 0.0765, 0.0749), (-0.1264, -0.0522, -0.1103), (-0.0280, -0.0881, -0.0499),
                    (-0.1262, -0.0982, -0.0778))
FLUX_RGB_BIAS = (-0.0329, -0.0718, -0.0851)


def shifted_format(scale: float, shift: float, name: str, factors=None, bias=None, taesd: str | None = None,
                   channels: int = CHANNELS) -> LatentFormat:
    """``(z − shift)·scale`` on ``channels`` channels as a ``LatentFormat``; preview factors only
    when they are for that many channels."""
    if factors is not None and len(factors) != channels:
        factors = bias = taesd = None
    return LatentFormat(scale_factor=scale, channels=channels, mean=(shift,) * channels, std=(1.0,) * channels,
                        name=name, latent_rgb_factors=factors, latent_rgb_factors_bias=bias,
                        taesd_decoder_name=taesd)


SD3_LATENT = shifted_format(1.5305, 0.0609, "sd3", SD3_RGB_FACTORS, SD3_RGB_BIAS, "taesd3_decoder")
FLUX_LATENT = shifted_format(0.3611, 0.1159, "flux", FLUX_RGB_FACTORS, FLUX_RGB_BIAS, "taef1_decoder")
