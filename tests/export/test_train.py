"""Training: the loss falls, runs are deterministic and resumable, checkpoints average."""

import json

import torch
from safetensors.torch import load_file

from export.checkpoint import CONFIG, TOKENIZER, WEIGHTS, average_state_dicts, load_model
from export.train import run


def test_tiny_training_lowers_the_loss(tiny_model_dir):
    history = json.loads((tiny_model_dir / CONFIG).read_text())["training"]["history"]
    assert len(history) == 3
    assert history[-1]["train_loss"] < history[0]["train_loss"] - 0.5
    assert history[-1]["valid_loss"] < history[0]["valid_loss"]
    for name in (WEIGHTS, CONFIG, TOKENIZER):
        assert (tiny_model_dir / name).is_file()


def test_model_dir_records_config_and_special_ids(tiny_model_dir):
    meta = json.loads((tiny_model_dir / CONFIG).read_text())
    assert meta["model"]["pad_id"] == 0 and meta["model"]["eos_id"] == 2
    assert meta["src_lang"] == "de" and meta["tgt_lang"] == "en"
    assert meta["training"]["averaged_epochs"] == [2, 3]


def test_final_weights_are_the_average_of_the_last_epochs(tiny_model_dir):
    ckpts = [load_file(str(tiny_model_dir / "checkpoints" / f"epoch{e:03d}.safetensors")) for e in (2, 3)]
    final = load_file(str(tiny_model_dir / WEIGHTS))
    avg = average_state_dicts(ckpts)
    for k, v in final.items():
        torch.testing.assert_close(v, avg[k])


def test_same_seed_same_weights_and_resume_continues(tmp_path, data_dir, make_train_args):
    one = run(make_train_args(tmp_path / "a", data_dir, "--epochs", "2", "--max-train-sentences", "600"))
    two = run(make_train_args(tmp_path / "b", data_dir, "--epochs", "2", "--max-train-sentences", "600"))
    a, b = load_file(str(one / WEIGHTS)), load_file(str(two / WEIGHTS))
    assert all(torch.equal(a[k], b[k]) for k in a)

    # Resume: run epoch 1 of 2 (stopping there), then resume for the remaining epoch.
    part = make_train_args(tmp_path / "c", data_dir, "--epochs", "2", "--max-train-sentences", "600")
    part.epochs = 1
    run(part)
    resumed = run(
        make_train_args(tmp_path / "c", data_dir, "--epochs", "2", "--max-train-sentences", "600", "--resume")
    )
    meta = json.loads((resumed / CONFIG).read_text())["training"]
    assert [h["epoch"] for h in meta["history"]] == [1, 2]
    assert meta["steps"] == json.loads((one / CONFIG).read_text())["training"]["steps"]
    load_model(resumed)
