"""uint8 image batches normalised inside the step (ImageTask.pixels): the model gets what a host
normalisation in float64 would give it, float images pass through, bad statistics are refused."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from flurka.data.core import DatasetInfo
from flurka.models import build_model
from flurka.training.tasks import ImageTask, make_task
from tests.support.model_helpers import TINY

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def reference(pixels: np.ndarray) -> np.ndarray:
    """(x / 255 - mean) / std per channel, in float64, from the formula."""
    x = pixels.astype(np.float64) / 255.0
    return (x - np.array(MEAN, np.float64)) / np.array(STD, np.float64)


def test_uint8_pixels_are_scaled_and_normalised_per_channel():
    pixels = np.random.default_rng(0).integers(0, 256, (2, 5, 7, 3), dtype=np.uint8)
    pixels[0, 0, 0] = (0, 255, 128)   # the ends of the range
    got = ImageTask(("accuracy",), pixel_mean=MEAN, pixel_std=STD).pixels(jnp.asarray(pixels))
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got, np.float64), reference(pixels), rtol=1e-6, atol=1e-6)
    plain = ImageTask(("accuracy",)).pixels(jnp.asarray(pixels))   # no statistics: [0, 1] only
    np.testing.assert_allclose(np.asarray(plain), pixels / 255.0, rtol=1e-6, atol=1e-7)
    floats = jnp.asarray(reference(pixels), jnp.float32)
    assert ImageTask(("accuracy",), pixel_mean=MEAN, pixel_std=STD).pixels(floats) is floats


def test_the_model_sees_the_same_input_from_uint8_on_the_device_as_from_floats_on_the_host():
    info = DatasetInfo(name="img", task="image", vocab_size=0, max_len=0, num_classes=3,
                       image_shape=(8, 8, 3), pixel_mean=MEAN, pixel_std=STD)
    config = type("C", (), {"task": "image", "metrics": ("accuracy",), "label_smoothing": 0.0})()
    task = make_task(config, info)
    assert (task.pixel_mean, task.pixel_std) == (MEAN, STD)
    model = build_model(info, {**TINY, "attention": "full", "patch_size": 4, "pooling": "cls"},
                        rngs=nnx.Rngs(0))
    pixels = np.random.default_rng(1).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    on_device = task.forward(model, {"image": jnp.asarray(pixels)}, deterministic=True)
    on_host = model(jnp.asarray(reference(pixels), jnp.float32), deterministic=True)
    np.testing.assert_allclose(np.asarray(on_device), np.asarray(on_host), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mean, std", [((0.5,), (0.2, 0.2)), ((0.5, 0.5, 0.5), (0.2, 0.0, 0.2))])
def test_statistics_of_other_lengths_or_zero_deviation_are_refused(mean, std):
    with pytest.raises(ValueError, match="per-channel values of one length, the deviations positive"):
        ImageTask(("accuracy",), pixel_mean=mean, pixel_std=std)
