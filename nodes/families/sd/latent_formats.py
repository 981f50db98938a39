"""The SD family's latent formats (``vae/latent_format.LatentFormat``): scale, and how the sampler
previews each (ComfyUI ``comfy/latent_formats.py``: ``SD15``, ``SDXL``, ``SD_X4``).

SD 1.x and 2.x share ``SD15`` (scale 0.18215, ``taesd_decoder``); SDXL and its refiner ``SDXL``
(0.13025, a preview bias, ``taesdxl_decoder``); the x4 upscaler ``SD_X4`` (0.08333, its own
factors, no bias and no TAESD decoder; a latent pixel is 4 image pixels). Playground v2.5's
per-channel format is ``latent_format.PLAYGROUND_V2_5`` (``detect.py`` sets it).
"""

from __future__ import annotations

from mixgraph.nodes.families.sd.x4_upscaler import LATENT_SCALE as X4_LATENT_SCALE
from mixgraph.nodes.vae.latent_format import LatentFormat

__all__ = ["sd_latent_format", "SD1_RGB_FACTORS", "SDXL_RGB_FACTORS", "SDXL_RGB_BIAS", "SD_X4_RGB_FACTORS"]

# Rows: latent channels; columns: R, G, B (ComfyUI comfy/latent_formats.py SD15, SDXL, SD_X4).
SD1_RGB_FACTORS = ((0.3512, 0.2297, 0.3227),
                   (0.3250, 0.4974, 0.2350),
                   (-0.2829, 0.1762, 0.2721),
                   (-0.2120, -0.2616, -0.7177))
SDXL_RGB_FACTORS = ((0.3651, 0.4232, 0.4341),
                    (-0.2533, -0.0042, 0.1068),
                    (0.1076, 0.1111, -0.0362),
                    (-0.3165, -0.2492, -0.2188))
SDXL_RGB_BIAS = (0.1084, -0.0175, -0.0011)
SD_X4_RGB_FACTORS = ((-0.2340, -0.3863, -0.3257),
                     (0.0994, 0.0885, -0.0908),
                     (-0.2833, -0.2349, -0.3741),
                     (0.2523, -0.0055, -0.1651))

# variant -> (scale_factor, downscale, rgb factors, rgb bias, TAESD decoder name)
_FORMATS = {
    "sd1": (0.18215, 8, SD1_RGB_FACTORS, None, "taesd_decoder"),
    "sd2": (0.18215, 8, SD1_RGB_FACTORS, None, "taesd_decoder"),
    "sdxl": (0.13025, 8, SDXL_RGB_FACTORS, SDXL_RGB_BIAS, "taesdxl_decoder"),
    "sdxl_refiner": (0.13025, 8, SDXL_RGB_FACTORS, SDXL_RGB_BIAS, "taesdxl_decoder"),
    "sd2_x4": (X4_LATENT_SCALE, 4, SD_X4_RGB_FACTORS, None, None),
}


def sd_latent_format(variant: str, channels: int = 4) -> LatentFormat:
    """``variant``'s own (scalar) latent format; an unknown variant gets SD 1.x's scale and no
    preview. The
    preview factors are for 4 channels: a format of another width gets none (no latent2rgb
    preview), as does its TAESD decoder."""
    scale, downscale, factors, bias, taesd = _FORMATS.get(variant, (0.18215, 8, None, None, None))
    if channels != 4:
        factors = bias = taesd = None
    return LatentFormat(scale, channels, downscale, latent_rgb_factors=factors,
                        latent_rgb_factors_bias=bias, taesd_decoder_name=taesd)
