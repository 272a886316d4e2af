"""The built-in policy's adapter helpers (training.policy)."""
from __future__ import annotations

import pytest


def _logits(policy: str, adapter: str | None):
    import torch

    from training.policy import load_model, load_tokenizer

    tok = load_tokenizer(policy)
    ids = torch.tensor([tok.encode('<|user|>order O-1003 refund_order {"days":12}<|end|>')])
    with torch.no_grad():
        return load_model(policy, adapter).eval()(ids).logits


def test_scaled_adapter_interpolates_between_the_base_and_the_adapter(tiny_policy, tiny_adapter, tmp_path):
    import torch
    from safetensors.torch import load_file

    from training.policy import scale_adapter

    half = scale_adapter(tiny_adapter, tmp_path / "half", 0.5)
    zero = scale_adapter(tiny_adapter, tmp_path / "zero", 0.0)
    full, scaled = load_file(f"{tiny_adapter}/adapter_model.safetensors"), load_file(f"{half}/adapter_model.safetensors")
    assert set(full) == set(scaled) and any("lora_B" in k for k in full)
    for k, t in full.items():  # B halved, A untouched: the update B·A is halved
        assert torch.equal(scaled[k], t * 0.5 if "lora_B" in k else t)
    base, adapted = _logits(tiny_policy, None), _logits(tiny_policy, tiny_adapter)
    assert not torch.allclose(base, adapted, atol=1e-3)
    assert torch.allclose(_logits(tiny_policy, str(zero)), base, atol=1e-5)
    mid = _logits(tiny_policy, str(half))
    assert (mid - base).abs().mean() < (adapted - base).abs().mean()
    assert not (tmp_path / "half.tmp").exists()


def test_scale_adapter_needs_safetensors_weights(tmp_path):
    from training.policy import scale_adapter

    with pytest.raises(FileNotFoundError, match="safetensors"):
        scale_adapter(tmp_path, tmp_path / "out", 0.5)
    assert not (tmp_path / "out").exists()
