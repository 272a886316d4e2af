"""The built-in policy: a BPE tokenizer and a small Llama model trained from scratch.

No weights can be downloaded here, so the default policy is built locally and saved as an ordinary
Hugging Face folder (`config.json`, `model.safetensors`, `tokenizer.json`, ...) that transformers,
peft and vLLM all load. Any Hugging Face causal-LM folder can stand in for it.

Why these choices (../shared/PROTOTYPE-FINDINGS.md): digits are split into single tokens (numbers
in rules and observations are then learned far better), the byte-level alphabet means any text
encodes without unknown tokens, and special tokens mark the turn structure so that scaffolds can
encode each segment on its own and rollouts never re-tokenize what was sampled.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

# Turn-structure tokens shared with runtime/scaffolds.py (kept as plain strings: no torch import).
PAD, BOS, EOS = "<pad>", "<s>", "</s>"
SYSTEM, TOOLS, MEMORY, USER, ASSISTANT, OBS, END = (
    "<|system|>", "<|tools|>", "<|memory|>", "<|user|>", "<|assistant|>", "<|obs|>", "<|end|>",
)
SPECIAL_TOKENS = [PAD, BOS, EOS, SYSTEM, TOOLS, MEMORY, USER, ASSISTANT, OBS, END]


@dataclass(frozen=True)
class PolicyPreset:
    """Model and tokenizer sizes. `tiny` trains in seconds (tests); `small` is the demo policy."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int


PRESETS: dict[str, PolicyPreset] = {
    "tiny": PolicyPreset(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,  # head_dim 32: vLLM CPU attention needs >= 32
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024),
    "small": PolicyPreset(vocab_size=1024, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024),
}


def train_tokenizer(texts: Iterable[str], vocab_size: int):
    """Train a byte-level BPE tokenizer (single-digit numbers, turn tokens) on `texts`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in (PAD, BOS, EOS)],
        clean_up_tokenization_spaces=False,
    )
    fast.padding_side = "left"
    return fast


def build_model(preset: str | PolicyPreset, tokenizer, seed: int = 0):
    """A freshly initialised `LlamaForCausalLM` sized by `preset`, matched to `tokenizer`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    p = PRESETS[preset] if isinstance(preset, str) else preset
    cfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=p.hidden_size, intermediate_size=p.intermediate_size,
        num_hidden_layers=p.num_hidden_layers, num_attention_heads=p.num_attention_heads,
        num_key_value_heads=p.num_key_value_heads, max_position_embeddings=p.max_position_embeddings,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=[tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(END)],
        pad_token_id=tokenizer.pad_token_id, rms_norm_eps=1e-5, dtype="float32",
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).to(torch.float32)


def save_policy(model, tokenizer, out_dir: str | Path, meta: dict | None = None) -> Path:
    """Write model + tokenizer as a standard HF folder (plus `evolve_policy.json` metadata)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    if meta is not None:
        (out / "evolve_policy.json").write_text(json.dumps(meta, indent=2))
    return out


def build_policy(out_dir: str | Path, preset: str, texts: Iterable[str], seed: int = 0) -> Path:
    """Train the tokenizer on `texts`, initialise the model, save both under `out_dir`."""
    p = PRESETS[preset]
    tok = train_tokenizer(texts, p.vocab_size)
    model = build_model(p, tok, seed=seed)
    return save_policy(model, tok, out_dir, meta={"preset": preset, "seed": seed, **asdict(p)})


def load_tokenizer(path: str | Path):
    """Load the tokenizer of any HF policy folder (left padding, a pad token always set)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_model(path: str | Path, adapter: str | Path | None = None, trainable: bool = False):
    """Load a causal LM in float32 (optionally with a peft LoRA adapter on top)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter), is_trainable=trainable)
    return model.train(trainable) if trainable else model.eval()


def stop_token_ids(tokenizer) -> tuple[int, ...]:
    """Ids that end an assistant turn: the turn-end token (if the vocabulary has it) and EOS."""
    ids = [tokenizer.eos_token_id]
    end = tokenizer.convert_tokens_to_ids(END)
    if isinstance(end, int) and end != tokenizer.unk_token_id and end is not None:
        ids.insert(0, end)
    return tuple(i for i in ids if i is not None)


def lora_config(r: int = 8, alpha: int = 16, dropout: float = 0.0, random_init: bool = False):
    """The project's LoRA layout: all linear layers of the Llama block (q k v o gate up down).

    `random_init=True` gives a non-zero adapter at once (tests and benchmarks need one that
    changes outputs); training starts from peft's default (B = 0, the base model's outputs).
    """
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, bias="none", task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                      init_lora_weights=not random_init)


def save_random_adapter(model_path: str | Path, out_dir: str | Path, r: int = 8, seed: int = 0,
                        scale: float = 1.0) -> Path:
    """A LoRA adapter with random A and B (seeded), saved with `save_pretrained`: for tests and benchmarks."""
    import torch
    from peft import get_peft_model

    torch.manual_seed(seed)
    model = get_peft_model(load_model(model_path), lora_config(r=r, random_init=True))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05 * scale)
    model.save_pretrained(str(out_dir))
    return Path(out_dir)


def scale_adapter(src: str | Path, dst: str | Path, scale: float) -> Path:
    """A copy of the LoRA adapter at `src` whose update is `scale` times the original (every
    `lora_B` multiplied by `scale`, so B·A is): 0 is the base model, 1 the adapter. Why: weight
    interpolation toward the base (WiSE-FT) trades some of a fine-tune's gain for what it forgot,
    and the evolve cycle picks the scale on held-out tasks (evolve.selection). Written to a
    temporary folder and renamed, so a killed write leaves no half adapter at `dst`."""
    import shutil

    from safetensors.torch import load_file, save_file

    src, dst = Path(src), Path(dst)
    weights = src / "adapter_model.safetensors"
    if not weights.exists():
        raise FileNotFoundError(f"{weights}: scale_adapter needs a safetensors LoRA adapter")
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    sd = load_file(str(weights))
    save_file({k: (t * scale if "lora_B" in k else t).contiguous() for k, t in sd.items()},
              str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    return dst
