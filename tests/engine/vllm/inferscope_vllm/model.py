"""Writes the test model directory: a tiny Llama config and a WordLevel tokenizer, no weights.

    python3 -m inferscope_vllm.model DIR

The vocabulary is `<unk> <s> </s> <pad>` plus words `w4 … w31999`: prompts written as those
words tokenize one token per word, so a test knows every prompt's token count, and ids above
127 make each prompt token 3 bytes of msgpack on vLLM's IPC (long prompts give new-request
messages of several KiB, as real vocabularies do).
"""
import json
import sys
from pathlib import Path

VOCAB = 32000
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
# One line per message, no special tokens: a chat prompt's token count is the words of its
# messages plus one role word each.
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"


def word(i: int) -> str:
    return SPECIALS[i] if i < len(SPECIALS) else f"w{i}"


def write(out: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    out.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 3,
        "torch_dtype": "float32",
        "tie_word_embeddings": False,
    }
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2})
    )
    tok = Tokenizer(models.WordLevel({word(i): i for i in range(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "pad_token": "<pad>",
                "add_bos_token": False,
                "add_eos_token": False,
                "model_max_length": 8192,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=1,
        )
    )
    (out / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"})
    )
    return out


if __name__ == "__main__":
    print(write(Path(sys.argv[1])))
