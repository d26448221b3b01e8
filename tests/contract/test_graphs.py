"""The graphs' names are spelled once, in contract/graphs.py: its constants and per-layer helpers."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import pytest

import contract.graphs as g

LAYERS = 3
DIMS = SimpleNamespace(vocab_size=11, d_model=8, n_heads=2, d_k=4, n_decoder_layers=LAYERS)
PER_LAYER = (
    g.cross_key,
    g.cross_value,
    g.past_key,
    g.past_value,
    g.cache_key,
    g.cache_value,
    g.present_key,
    g.present_value,
)


def named() -> set[str]:
    """Every graph name the contract spells: its upper-case string constants and per-layer names."""
    constants = {v for k, v in vars(g).items() if k.isupper() and isinstance(v, str)}
    return constants | {name(i) for name in PER_LAYER for i in range(LAYERS)}


@pytest.mark.parametrize(
    "io",
    [g.encoder_io, g.decoder_io, g.fused_decoder_io, partial(g.fused_decoder_io, scored=False)],
    ids=["encoder", "decoder", "fused", "fused-unscored"],
)
def test_every_input_and_output_is_a_named_one(io) -> None:
    inputs, outputs = io(DIMS)
    names = [t.name for t in inputs + outputs]
    assert set(names) <= named()
    assert len(set(names)) == len(names)


def test_per_layer_names_differ_by_kind_and_layer() -> None:
    names = [name(i) for name in PER_LAYER for i in range(12)]
    assert len(set(names)) == len(names)
    assert [name(0) for name in PER_LAYER] == [
        "cross_key_0",
        "cross_value_0",
        "past_key_0",
        "past_value_0",
        "cache_key_0",
        "cache_value_0",
        "present_key_0",
        "present_value_0",
    ]


def test_search_names() -> None:
    assert g.SEARCH_INPUT == g.TOP_K
    assert g.SEARCH_OUTPUTS == (g.TOP_LOG_PROBS, g.TOP_IDS, g.EOS_LOG_PROB)
