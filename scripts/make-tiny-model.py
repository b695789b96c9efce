#!/usr/bin/env python3
"""Builds a tiny random-weights Qwen3 model directory that `vllm serve` loads on CPU.

    python scripts/make-tiny-model.py OUT_DIR [--template PATH] [--layers 2] [--seed 0]
    python scripts/make-tiny-model.py OUT_DIR --family llama3

With `--family llama3` it is a Llama (LlamaForCausalLM, the same sizes) with Llama 3's
special tokens (<|begin_of_text|>, <|end_of_text|>, the header tokens, <|eot_id|>,
<|eom_id|>, <|python_tag|>), Llama 3's split pattern (a run of newlines whole),
<|eot_id|> as the end of turn, all three of <|eot_id|>, <|eom_id|> and <|end_of_text|>
as generation_config's end-of-sequence tokens (as Llama 3.2's), and the Llama 3.2
JSON-call template vLLM's examples carry (tests/fixtures/templates/llama32_json.jinja)
by default. With `--family mistral` it is a Mistral (MistralForCausalLM) with Mistral's
control tokens, `</s>` the end of turn, and the v11+ template
(tests/fixtures/templates/mistral_v11_tools.jinja) by default; `[TOOL_CALLS]` and
`[ARGS]` are added as ordinary tokens (as the Qwen3 model's `<tool_call>` is) so that a
structured-output regex can write a call.

Run it with the python printed by scripts/real-vllm-env.sh (it needs torch,
transformers and tokenizers). Nothing is downloaded: the tokenizer is a byte-level
BPE trained here on a few kilobytes of text, with Qwen's special tokens
(<|endoftext|>, <|im_start|>, <|im_end|> as special tokens; <tool_call>,
</tool_call>, <think>, </think>, <tool_response>, </tool_response> as added
non-special tokens, as Qwen3 has them), and the chat template is one of the
project's test templates (tests/fixtures/templates/qwen3_like.jinja by default).
The model is Qwen3ForCausalLM with 2 layers, hidden size 64, 4 query heads and 2 KV
heads of dimension 32 (a head size vLLM's CPU attention supports). The model's
vocabulary is exactly the tokenizer's by default: with random weights, IDs past the
tokenizer (real checkpoints pad their embedding matrix) do get sampled, and they
decode to nothing; --pad-vocab-to N pads like a real checkpoint when a test wants
that. generation_config.json names <|im_end|> as the only end-of-sequence token by
default (--eos both adds <|endoftext|>, as Qwen3's does): when a structured-output
grammar completes, vLLM lets the model pick any end-of-sequence token, and with
both a random model ends about half its tool calls with <|endoftext|> instead of
the end of turn. Weights are random from --seed, so the same arguments give
byte-identical files. Takes about 5-10 seconds; the directory is under 1 MB.
"""

import argparse
import json
import os
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_TEMPLATE = REPO / "tests" / "fixtures" / "templates" / "qwen3_like.jinja"

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>", "</tool_response>"]

# Llama 3's: its special tokens, its split pattern, its template (vLLM's Llama 3.2 one).
LLAMA3_SPECIAL = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
]
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_TEMPLATE = REPO / "tests" / "fixtures" / "templates" / "llama32_json.jinja"

MISTRAL_SPECIAL = [
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
]
MISTRAL_TEMPLATE = REPO / "tests" / "fixtures" / "templates" / "mistral_v11_tools.jinja"

# Each family's tokens: the special ones, the ordinary added ones, the split pattern
# (None: byte-level GPT-2's), the begin, end-of-turn and padding tokens, the template.
FAMILIES = {
    "qwen3": dict(special=SPECIAL, added=ADDED, split=None, bos=None, eos="<|im_end|>",
                  pad="<|endoftext|>", template=DEFAULT_TEMPLATE),
    "llama3": dict(special=LLAMA3_SPECIAL, added=[], split=LLAMA3_SPLIT, bos="<|begin_of_text|>",
                   eos="<|eot_id|>", pad="<|end_of_text|>", template=LLAMA3_TEMPLATE),
    "mistral": dict(special=MISTRAL_SPECIAL, added=["[TOOL_CALLS]", "[ARGS]"], split=None, bos="<s>",
                    eos="</s>", pad="<unk>", template=MISTRAL_TEMPLATE),
}

# Training text for the BPE: chat-ish English, JSON tool calls and code, so that
# ordinary prompts tokenize into a reasonable number of tokens.
CORPUS = [
    "You are a helpful assistant. Answer the user's question, calling tools when needed.",
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.",
    "What is the weather in Paris today? It is sunny, with a high of 21 degrees.",
    "Please read the file src/main.rs and tell me what the function does.",
    "Let me think about this step by step. First, compute 12 * 7 = 84. Then add 16 to get 100.",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    '{"name": "read_file", "arguments": {"path": "src/lib.rs"}}',
    '{"name": "run", "arguments": {"command": "cargo test --quiet"}}',
    '{"type": "function", "function": {"name": "add", "description": "Add two numbers", '
    '"parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}',
    "fn main() {\n    println!(\"hello, world\");\n}\n",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    "The answer is 42. The result is 7. Done. Yes. No. OK. Thanks!",
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n",
    "For each function call, return a json object with function name and arguments.",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 100 1000",
]


def build_tokenizer(out: pathlib.Path, template: str, vocab_size: int, family: dict):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    if family["split"]:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(family["split"]), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=family["special"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    if family["added"]:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in family["added"]])

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=family["eos"],
        pad_token=family["pad"],
        bos_token=family["bos"],
        unk_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
    fast.chat_template = template
    fast.save_pretrained(out)
    return fast


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=pathlib.Path)
    ap.add_argument("--family", choices=sorted(FAMILIES), default="qwen3")
    ap.add_argument("--template", type=pathlib.Path, default=None)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--bpe-vocab", type=int, default=1000, help="BPE vocabulary before the added tokens")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pad-vocab-to", type=int, default=0, help="round the model's vocabulary up to a multiple of this")
    ap.add_argument("--eos", choices=["im_end", "both"], default="im_end")
    args = ap.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    family = FAMILIES[args.family]
    template = args.template or family["template"]
    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(args.out, template.read_text(), args.bpe_vocab, family)
    n_tokens = len(tokenizer)
    pad = max(args.pad_vocab_to, 1)
    vocab = (n_tokens + pad - 1) // pad * pad
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in family["special"] + family["added"]}

    torch.manual_seed(args.seed)
    if args.family != "qwen3":
        return save_llama_like(args, n_tokens, vocab, ids)
    config = Qwen3Config(
        rope_theta=1_000_000.0,
        **sizes(args, vocab, ids, "<|endoftext|>", "<|im_end|>", "<|endoftext|>"),
    )
    model = Qwen3ForCausalLM(config).to(torch.float32).eval()
    spread(model)
    model.save_pretrained(args.out, safe_serialization=True)
    GenerationConfig(
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|im_end|>"]] + ([ids["<|endoftext|>"]] if args.eos == "both" else []),
        pad_token_id=ids["<|endoftext|>"],
    ).save_pretrained(args.out)

    summarize(args.out, n_tokens, vocab, ids)


def sizes(args, vocab, ids, bos, eos, pad):
    """Every family's model: 2 layers, hidden size 64, 4 query heads and 2 KV heads of
    dimension 32 (a head size vLLM's CPU attention supports), tied embeddings, fp32."""
    return dict(
        vocab_size=vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 2,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=ids[bos],
        eos_token_id=ids[eos],
        pad_token_id=ids[pad],
        dtype="float32",
    )


def spread(model):
    """A larger spread than the default 0.02 makes the next-token distribution less
    flat, so greedy decoding and logprobs are less tie-prone."""
    import torch

    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)


def save_llama_like(args, n_tokens, vocab, ids):
    """The Llama or Mistral model (one architecture, two names and token sets)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    llama = args.family == "llama3"
    bos, eos, pad = ("<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>") if llama else ("<s>", "</s>", "<unk>")
    shape = sizes(args, vocab, ids, bos, eos, pad)
    if llama:
        model = LlamaForCausalLM(LlamaConfig(rope_theta=500_000.0, **shape))
        # As Llama 3.2's generation_config.json: any of the three ends a turn.
        ends = [ids["<|end_of_text|>"], ids["<|eom_id|>"], ids["<|eot_id|>"]]
    else:
        model = MistralForCausalLM(MistralConfig(rope_theta=1_000_000.0, sliding_window=None, **shape))
        ends = [ids["</s>"]]
    model = model.to(torch.float32).eval()
    spread(model)
    model.save_pretrained(args.out, safe_serialization=True)
    GenerationConfig(bos_token_id=ids[bos], eos_token_id=ends, pad_token_id=ids[pad]).save_pretrained(args.out)
    summarize(args.out, n_tokens, vocab, ids)


def summarize(out, n_tokens, vocab, ids):
    summary = {"tokenizer_len": n_tokens, "vocab_size": vocab, "token_ids": ids}
    (out / "rollout-tiny-model.json").write_text(json.dumps(summary, indent=2) + "\n")
    json.dump(summary, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
