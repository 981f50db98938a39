"""Published sigma tables the table-driven schedulers interpolate (data, not code).

* ``AYS_NOISE_LEVELS``: Align Your Steps (Sabour, Fidler & Kreis 2024, "Align Your Steps:
  Optimizing Sampling Schedules in Diffusion Models"), the 10-step schedules NVIDIA published
  for SD 1.x, SDXL and SVD, as ComfyUI's ``AlignYourStepsScheduler`` uses them.
* ``OPTIMAL_STEPS_NOISE_LEVELS``: Optimal Stepsize for Diffusion Sampling (Jing et al. 2025,
  "Optimal Stepsize for Diffusion Sampling"), the tables of ComfyUI's ``OptimalStepsScheduler``
  (flow models: FLUX, Wan, Chroma; sigmas in [0, 1]).
"""

from __future__ import annotations

__all__ = ["AYS_NOISE_LEVELS", "OPTIMAL_STEPS_NOISE_LEVELS"]

AYS_NOISE_LEVELS: dict[str, tuple[float, ...]] = {
    "SD1": (14.6146412293, 6.4745760956, 3.8636745985, 2.6946151520, 1.8841921177,
            1.3943805092, 0.9642583904, 0.6523686016, 0.3977456272, 0.1515232662,
            0.0291671582),
    "SDXL": (14.6146412293, 6.3184485287, 3.7681790315, 2.1811480769, 1.3405244945,
             0.8620721141, 0.5550693289, 0.3798540708, 0.2332364134, 0.1114188177,
             0.0291671582),
    "SVD": (700.00, 54.5, 15.886, 7.977, 4.248, 1.789, 0.981, 0.403, 0.173, 0.034, 0.002),
}

OPTIMAL_STEPS_NOISE_LEVELS: dict[str, tuple[float, ...]] = {
    "FLUX": (0.9968, 0.9886, 0.9819, 0.975, 0.966, 0.9471, 0.9158, 0.8287, 0.5512, 0.2808,
             0.001),
    "Wan": (1.0, 0.997, 0.995, 0.993, 0.991, 0.989, 0.987, 0.985, 0.98, 0.975, 0.973, 0.968,
            0.96, 0.946, 0.927, 0.902, 0.864, 0.776, 0.539, 0.208, 0.001),
    "Chroma": (0.992, 0.99, 0.988, 0.985, 0.982, 0.978, 0.973, 0.968, 0.961, 0.953, 0.943,
               0.931, 0.917, 0.9, 0.881, 0.858, 0.832, 0.802, 0.769, 0.731, 0.69, 0.646,
               0.599, 0.55, 0.501, 0.451, 0.402, 0.355, 0.311, 0.27, 0.232, 0.199, 0.169,
               0.143, 0.12, 0.101, 0.084, 0.07, 0.058, 0.048, 0.001),
}
