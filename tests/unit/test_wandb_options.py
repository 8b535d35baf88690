"""Weights & Biases settings (config/wandb_env.py, training/wandb_log.py): the environment's WANDB_PROJECT,
WANDB_ENTITY, WANDB_MODE and WANDB_DIR hold unless the config sets the field; online without an API key is one
sentence before the ranks start, with nothing written; offline from the environment writes W&B's offline run."""

from __future__ import annotations

import time

import pytest

from megatron_mtp.config import load_config
from megatron_mtp.config.wandb_env import wandb_options
from megatron_mtp.errors import is_one_sentence
from megatron_mtp.training.wandb_log import has_api_key

KEYS = ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "NETRC", "WANDB_MODE", "WANDB_BASE_URL", "WANDB_CONFIG_DIR",
        "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_DIR")


@pytest.fixture
def bare_home(tmp_path, monkeypatch):
    """A machine where W&B has no settings and no credentials (HOME a fresh folder)."""
    for key in KEYS:
        monkeypatch.delenv(key, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def _logging(*overrides):
    return load_config(None, [f"logging.{o}" for o in overrides]).logging


def test_the_environment_holds_where_the_config_sets_nothing(tmp_path):
    run = tmp_path / "run"
    env = {"WANDB_PROJECT": "env-project", "WANDB_ENTITY": "env-team", "WANDB_MODE": "offline",
           "WANDB_DIR": str(tmp_path / "env-dir")}
    got = wandb_options(_logging(), run, env)
    assert (got.project, got.project_from, got.entity, got.mode, got.dir) == (
        "env-project", "WANDB_PROJECT", "env-team", "offline", tmp_path / "env-dir")
    mine = wandb_options(_logging("wandb_project=p", "wandb_entity=me", "wandb_mode=online",
                                  f"wandb_dir={tmp_path / 'mine'}"), run, env)
    assert (mine.project, mine.project_from, mine.entity, mine.mode, mine.dir) == (
        "p", "logging.wandb_project", "me", "online", tmp_path / "mine")
    plain = wandb_options(_logging("wandb_project=p"), run, {})
    assert (plain.entity, plain.mode, plain.dir) == (None, "online", run)  # W&B's defaults, files in the run
    assert wandb_options(_logging(), run, {}) is None  # no project anywhere: no W&B
    assert wandb_options(_logging("wandb_project=p"), run, {"WANDB_MODE": "disabled"}) is None
    assert wandb_options(_logging("wandb_project=p", "wandb_mode=offline"), run, {"WANDB_MODE": "online"}).mode \
        == "offline"


def test_an_api_key_is_found_where_wandb_looks_for_it(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    assert not has_api_key({"HOME": str(home)})
    assert has_api_key({"HOME": str(home), "WANDB_API_KEY": "k" * 40})
    (home / ".netrc").write_text("machine example.org\n  login user\n  password secret\n")
    assert not has_api_key({"HOME": str(home)})  # another host's entry is no W&B key
    (home / ".netrc").write_text(f"machine api.wandb.ai\n  login user\n  password {'k' * 40}\n")
    assert has_api_key({"HOME": str(home)})  # what `wandb login` writes
    (home / ".netrc").rename(tmp_path / "elsewhere")
    assert has_api_key({"HOME": str(home), "NETRC": str(tmp_path / "elsewhere")})


def test_online_without_a_key_is_one_sentence_before_anything_starts(tmp_path, bare_home, capsys):
    from megatron_mtp.cli import main

    run = tmp_path / "run"
    assert main(["train", "--run-dir", str(run), "logging.wandb_project=p"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("megatron-mtp train: error: W&B logging is on (logging.wandb_project=p)"), err
    assert "no W&B API key" in err and "WANDB_MODE=offline" in err
    assert is_one_sentence(err.split("error: ", 1)[1]) and len(err.splitlines()) == 1, err
    assert not run.exists()


def test_offline_from_the_environment_writes_the_offline_run(tmp_path, bare_home, monkeypatch):
    """WANDB_MODE=offline, WANDB_PROJECT and WANDB_DIR set, no W&B field in the config and no key: the W&B run's
    file lands under WANDB_DIR/wandb/offline-run-*/ with the logged steps."""
    pytest.importorskip("wandb")
    from megatron_mtp.training.wandb_log import WandbRun, check_credentials
    from tests.dist.test_train_resume import wandb_history

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_PROJECT", "env-project")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    cfg, run = load_config(None), tmp_path / "run"
    check_credentials(cfg, run)  # offline needs no key
    options = wandb_options(cfg.logging, run)
    assert (options.project, options.mode) == ("env-project", "offline")
    logged = WandbRun(cfg, run, options)
    for step in (1, 2):
        logged.log(step, {"train/lm_loss": 3.0 - step})
    logged.finish()
    run_id = (run / "logs" / "wandb_run_id").read_text().strip()
    files = sorted((tmp_path / "wandb-dir" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert [f.name for f in files] == [f"run-{run_id}.wandb"]
    deadline = time.monotonic() + 20  # W&B's service process may still be flushing the file after finish()
    while True:
        rows = [(row["_step"], row["train/lm_loss"]) for row in wandb_history(files[0])]
        if len(rows) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert rows == [(1, 2.0), (2, 1.0)]
    assert not (run / "wandb").exists()
