"""Names of the imported models in the serving tests' repository (tests/service/conftest.py)."""

MARIAN = "opus-de-en"  # the tiny Marian import: de -> en, like the shipped de-en
M2M100 = "m2m"  # the tiny M2M100 import: the wmt21 languages, any of them into any other
M2M100_PADDED = "m2m100-padded"  # an M2M100 import of 100 languages that emits ids vocab.json lacks
