"""The examples: the Hugging Face Llama client (examples/hf_llama_check.py) on the CPU with a tiny
config and a few training steps (logits, gradients and the loss curve agree with transformers' SDPA
path), and the MLA decode example (examples/mla_decode.py: its own float64 check)."""

import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples",
                      "hf_llama_check.py")


def test_hf_llama_check_on_cpu():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    result = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--size", "tiny",
                             "--steps", "6", "--lr", "3e-3"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "RESULT: PASS" in result.stdout
    assert "| logits" in result.stdout and "loss flashattn" in result.stdout


def test_mla_decode_example():
    script = os.path.join(os.path.dirname(SCRIPT), "mla_decode.py")
    result = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "MLA decode: out (4, 2, 128, 512)" in result.stdout
