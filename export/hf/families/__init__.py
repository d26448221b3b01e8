"""The model families `mtserve import` takes, one module each (`marian`, `m2m100`), each declaring
one `registry.Family` registered under its config.json `architectures` name(s). A new family is one
new module here: `registry.family_for` imports every module of this package before it looks."""
