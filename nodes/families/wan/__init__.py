"""The Wan 2.1 / 2.2 video DiT family (t2v, i2v, first-last-frame, Wan 2.2 experts and 5B ti2v, VACE)."""
