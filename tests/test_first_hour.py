"""A newcomer's first hour (issue 42): the mistakes and waits that cost time, each answered at once and clearly."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_one_line_error, run_main
from typer.testing import CliRunner

from csekit.cli import app
from csekit.core.errors import CsekitError
from csekit.encoding import encoder as encoder_module
from csekit.encoding.encoder import SentenceEncoder, hub_reachable, looks_like_hub_id


@pytest.fixture
def hub_out_of_reach(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The hub cannot be reached; the options every `AutoConfig.from_pretrained` call got, recorded."""
    monkeypatch.setattr(encoder_module, "hub_reachable", lambda timeout=0.0: False)
    calls: list[dict[str, Any]] = []
    original = encoder_module.AutoConfig.from_pretrained

    def recording(name: str, *args: Any, **options: Any) -> Any:
        calls.append(options)
        return original(name, *args, **options)

    monkeypatch.setattr(encoder_module.AutoConfig, "from_pretrained", recording)
    return calls


@pytest.mark.parametrize("name", ["minilm-l12", "someone/no-such-model-here"])
def test_a_mistyped_hub_name_fails_from_the_cache_with_suggestions_when_the_hub_is_out_of_reach(
    name: str, hub_out_of_reach: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No network request and so none of huggingface_hub's retries (about 25 s): the cache only, then one line
    with the local-folder and alias suggestions. `owner/name` is a hub id too, not a missing path."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CsekitError) as error:
        SentenceEncoder.load(name)
    message = str(error.value)
    assert f'"{name}"' in message and "hub cannot be reached" in message
    assert "best/" in message and "minilm-l6" in message
    assert hub_out_of_reach and all(options.get("local_files_only") is True for options in hub_out_of_reach)
    if name == "minilm-l12":
        assert "did you mean the alias minilm-l6?" in message


def test_a_missing_path_is_no_hub_id(hub_out_of_reach: list[dict[str, Any]], tmp_path: Path) -> None:
    for name in [str(tmp_path / "no-model"), "./no-model", "runs/qs/bst", "../x"]:
        with pytest.raises(CsekitError, match="does not exist"):
            SentenceEncoder.load(name)
    assert not hub_out_of_reach
    assert looks_like_hub_id("bert-base-uncased") and looks_like_hub_id("princeton-nlp/unsup-simcse-bert-base-uncased")
    assert not looks_like_hub_id("a/b/c") and not looks_like_hub_id("/abs") and not looks_like_hub_id("..")


def test_offline_mode_answers_without_a_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_connection(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("offline mode must not open a connection")

    monkeypatch.setattr(socket, "create_connection", no_connection)
    for value in ("1", "true", "ON"):
        monkeypatch.setenv("HF_HUB_OFFLINE", value)
        assert hub_reachable() is False
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    assert hub_reachable() is False


def test_the_probe_is_one_short_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in (*encoder_module.OFFLINE_VARIABLES, *encoder_module.PROXY_VARIABLES):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.example:8443")
    attempts: list[tuple[Any, float]] = []

    def refused(address: Any, timeout: float) -> None:
        attempts.append((address, timeout))
        raise OSError("unreachable")

    monkeypatch.setattr(socket, "create_connection", refused)
    assert hub_reachable() is False
    assert attempts == [(("hub.example", 8443), encoder_module.HUB_PROBE_SECONDS)]


def test_freq_with_a_mistyped_tokenizer_fails_fast_too(
    hub_out_of_reach: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run_main(
        monkeypatch, capsys, "freq", "--corpus", "c.txt", "--tokenizer", "bert-base-uncasd", "--output", "f.json"
    )
    assert_one_line_error(code, err, "--tokenizer", "bert-base-uncasd", "hub cannot be reached", "minilm-l6")


def test_evaluating_a_run_folder_names_its_best_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    (run / "best").mkdir(parents=True)
    (run / "checkpoint").mkdir()
    code, err = run_main(monkeypatch, capsys, "evaluate", str(run), "--data-dir", str(tmp_path))
    assert_one_line_error(code, err, f"its best model is {run / 'best'}")


def test_the_main_help_shows_no_type_beside_help() -> None:
    result = CliRunner().invoke(app, ["--help"], terminal_width=160)
    assert result.exit_code == 0 and "--help" in result.output and "<bool>" not in result.output


@pytest.mark.parametrize("command", ["train", "evaluate", "encode", "bench", "freq", "augment"])
def test_help_shows_no_type_beside_a_flag(command: str) -> None:
    result = CliRunner().invoke(app, [command, "--help"], terminal_width=160)
    assert result.exit_code == 0
    assert "<bool>" not in result.output
    assert "<path>" in result.output or "<text>" in result.output  # options that take a value keep their type
