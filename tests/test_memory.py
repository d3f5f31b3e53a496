"""hf_precision.memory: the one choice of what fits, shared by the image, video and training plans (no model here:
predictions are plain objects, so each check runs in milliseconds)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hf_precision.memory import choose, resident_bytes

GB = 10**9


def _prediction(gb: float, quantize: tuple = ()) -> SimpleNamespace:
    return SimpleNamespace(peak=int(gb * GB), quantize=quantize, label=lambda: f"layout {gb:g}",
                           details=lambda: f"peak {gb:g} GB")


def test_choose_takes_the_first_candidate_that_fits_and_predicts_no_further():
    predicted = []

    def predict(gb: float) -> SimpleNamespace:
        predicted.append(gb)
        return _prediction(gb)

    c = choose([9, 7, 5, 3], predict, 6 * GB)
    assert c.fits and c.prediction.peak == 5 * GB and c.tried[-1] is c.prediction
    assert predicted == [9, 7, 5]  # cheapest first: 3 GB would fit too, but costs more
    assert c.label() == "layout 5"  # the chosen prediction's attributes read through the choice
    assert c.describe() == "chosen for 6.00 GB: layout 5; peak 5 GB"


def test_when_nothing_fits_the_least_memory_is_named():
    c = choose([9, 4, 7, 4.0], _prediction, 3 * GB)
    assert not c.fits and c.prediction is c.tried[1] and len(c.tried) == 4  # the first of equal peaks
    assert c.describe() == "nothing fits; least memory for 3.00 GB: layout 4; peak 4 GB"


def test_the_reserve_is_held_back_from_the_budget_and_said():
    c = choose([5, 4], _prediction, 6 * GB, reserve=int(1.5 * GB))
    assert c.prediction.peak == 4 * GB and [t.peak for t in c.tried] == [5 * GB, 4 * GB]
    assert c.describe().startswith("chosen for 6.00 GB (1.50 GB held back for activations): layout 4")


def test_describe_quotes_the_measured_speed_of_a_quantized_storage():
    from hf_precision.recipe.devices import device_profile, speed_note

    quantize = (("transformer", "int8"),)
    c = choose([1], lambda gb: _prediction(gb, quantize), 2 * GB, device=device_profile("t4"))
    assert c.describe().endswith(f"; {speed_note(quantize, device_profile('t4'))}")


def test_choose_without_candidates_is_a_programming_error():
    with pytest.raises(ValueError, match="no candidates"):
        choose([], _prediction, GB)


def test_resident_bytes_per_offload_mode():
    weights = {"text_encoder": 10, "transformer": 40, "vae": 2}
    assert resident_bytes(weights, "none", ["vae"]) == 52  # without offload everything stays
    assert resident_bytes(weights, "model") == 40 and resident_bytes(weights, "model", ["vae", "absent"]) == 2
    layers = dict(leaf={"transformer": 4}, loose={"transformer": 2}, unquantized={"transformer": 80})
    assert resident_bytes(weights, "group", ["transformer"], **layers) == 5  # (2 x 4 + 2) x 40 / 80
    assert resident_bytes(weights, "sequential", ["transformer"], **layers) == 3  # (4 + 2) x 40 / 80
