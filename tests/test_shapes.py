"""The embedded model's world (nodes/models/shapes.py): captions, the held-out split, and the
pixel-statistics check on pictures drawn from known scenes."""

import random

import numpy as np

from mixgraph.nodes.models import shapes as S


def test_shapes_check_reads_back_every_attribute_of_drawn_scenes():
    rng = random.Random(1)
    for _ in range(300):
        scene = S.random_scene(rng, held_out=rng.random() < 0.5)
        verdict = S.check_image(S.render(scene, rng))
        assert (verdict.color, verdict.background, verdict.shape, verdict.position) == \
            (scene.color, scene.background, scene.shape, scene.position), (scene, verdict)


def test_shapes_check_on_upscaled_float_pictures():
    scene = S.Scene("red", "triangle", "large", "at the top left", "blue")
    img = S.render(scene).astype(np.float32) / 255.0
    big = img.repeat(4, axis=0).repeat(4, axis=1)  # 256x256, as the demo saves it
    verdict = S.check_image(big)
    assert (verdict.color, verdict.background, verdict.shape) == ("red", "blue", "triangle")
    assert abs(verdict.fill - 0.5) < 0.06


def test_shapes_check_of_a_plain_picture_finds_no_shape():
    plain = np.zeros((64, 64, 3), np.uint8) + np.array(S.COLORS["green"], np.uint8)
    verdict = S.check_image(plain)
    assert verdict.background == "green" and verdict.shape is None and verdict.color is None


def test_shapes_caption_parses_back_and_uses_articles():
    scene = S.Scene("orange", "square", "small", "on the right", "white")
    text = S.caption(scene)
    assert text == "a small orange square on the right on a white background"
    assert S.parse_caption(text) == {"color": "orange", "shape": "square", "size": "small",
                                     "position": "on the right", "background": "white"}
    assert S.caption(scene, size=False, position=False) == "an orange square on a white background"
    assert S.parse_caption("a blue circle on a yellow background") == {
        "color": "blue", "shape": "circle", "background": "yellow"}


def test_shapes_held_out_split_is_a_fixed_tenth():
    held = S.held_out_scenes()
    total = len(S.all_scenes())
    assert 0.08 < len(held) / total < 0.12
    rng = random.Random(0)
    assert not any(S.is_held_out(S.random_scene(rng)) for _ in range(500))
    assert all(S.is_held_out(S.random_scene(rng, held_out=True)) for _ in range(50))
