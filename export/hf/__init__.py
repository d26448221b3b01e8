"""Import local Hugging Face translation checkpoints (Marian/OPUS-MT, M2M100/NLLB) into mtserve's
own model (`export.model`): `families` holds one module per model family (its hooks, registered by
config.json's `architectures`), `config` checks the HF config and maps it to a `ModelConfig`,
`weights` maps the state dict, `tokenizer` carries the SentencePiece files and language tokens,
`parity` compares the result with transformers, and `importer` runs the whole `mtserve import`."""
