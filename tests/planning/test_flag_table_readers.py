"""The readers behind ``make engine-flags``, on small sources written the engines' ways.

The committed tables come from real releases (see test_flag_tables.py and, for
llama.cpp, the built binary in tests/e2e/test_engine_flags.py); these cases pin
down each declaration style the readers understand, without downloading.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.engine_flags import __main__ as engine_flags  # noqa: E402
from tools.engine_flags import cppargs, pyargs  # noqa: E402

VLLM_CONFIG = '''
from typing import Literal
Runner = Literal["auto", "generate", "pooling"]
Dtype = Literal["auto", "half"] | str

@config
class ModelConfig:
    runner: Runner = "auto"
    dtype: Dtype = "auto"
    enforce_eager: bool = False
    hf_token: bool | str | None = None
    max_model_len: int | None = None
    pooler_config: PoolerConfig | None = None
    _private: int = 0

@config
class PoolerConfig:
    normalize: bool = True

@config
class BaseFrontendArgs:
    enable_auto_tool_choice: bool = False

@config
class FrontendArgs(BaseFrontendArgs):
    port: int = 8000
'''

VLLM_ARGS = '''
class EngineArgs:
    @staticmethod
    def add_cli_args(parser):
        model_kwargs = get_kwargs(ModelConfig)
        group = parser.add_argument_group("Model")
        group.add_argument("--runner", **model_kwargs["runner"])
        group.add_argument("--dtype", **model_kwargs["dtype"])
        group.add_argument("--enforce-eager", **{**model_kwargs["enforce_eager"], "default": None})
        group.add_argument("--hf-token", **model_kwargs["hf_token"])
        group.add_argument("--max-model-len", "-mml", **model_kwargs["max_model_len"])
        group.add_argument("--pooler-config", **model_kwargs["pooler_config"])
        parser.add_argument("--headless", action="store_true")
        parser.add_argument("model_tag", nargs="?")
'''


def vllm_table() -> dict[str, pyargs.Option]:
    index = pyargs.Index.build([("vllm/config/model.py", VLLM_CONFIG),
                                ("vllm/engine/arg_utils.py", VLLM_ARGS)])
    return pyargs.table([*pyargs.add_argument_options(index, ["vllm/engine/arg_utils.py"]),
                         *pyargs.dataclass_options(index, "FrontendArgs")])


def test_vllm_config_fields_become_options_by_their_annotations() -> None:
    table = vllm_table()
    assert table["--runner"] == {"value": "required", "choices": ["auto", "generate", "pooling"]}
    assert table["--dtype"] == {"value": "required"}  # Literal | str: metavar, not choices
    assert table["--enforce-eager"] == {"value": "none", "negation": "--no-enforce-eager"}
    assert table["--no-enforce-eager"] == {"value": "none", "canonical": "--enforce-eager"}
    assert table["--hf-token"] == {"value": "optional"}
    assert table["-mml"] == {"value": "required", "canonical": "--max-model-len"}
    assert table["--pooler-config"] == {"value": "required"}  # a dataclass: JSON
    assert table["--headless"] == {"value": "none"}
    assert table["--enable-auto-tool-choice"]["negation"] == "--no-enable-auto-tool-choice"
    assert table["--port"] == {"value": "required"}
    assert "model_tag" not in table and "--private" not in table


# vLLM 0.31 moved `vllm serve`'s parser to entrypoints/launchers/cli_args.py; the
# flags declared there itself exist only in that module.
VLLM_LAUNCHER = '''
def make_arg_parser(parser):
    parser.add_argument("--headless", action="store_true", default=False)
    parser.add_argument("--api-server-count", "-asc", type=int, default=None)
    parser.add_argument("--config")
    parser = FrontendArgs.add_cli_args(parser)
    return EngineArgs.add_cli_args(parser)
'''


def test_vllm_options_come_from_wherever_the_serve_parser_is_built(tmp_path: Path) -> None:
    wheel = tmp_path / "vllm-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm/config/model.py", VLLM_CONFIG)
        archive.writestr("vllm/engine/arg_utils.py", VLLM_ARGS.replace(
            '"--headless", action="store_true"', '"--seed", type=int'))
        archive.writestr("vllm/entrypoints/launchers/cli_args.py", VLLM_LAUNCHER)
        archive.writestr("vllm/entrypoints/cli/bench/latency.py",
                         'def add_cli_args(parser):\n    parser.add_argument("--num-iters")\n')
    table = engine_flags.vllm_options(wheel)
    assert table["--headless"] == {"value": "none"}
    assert table["--api-server-count"] == {"value": "required"}
    assert table["-asc"] == {"value": "required", "canonical": "--api-server-count"}
    assert table["--config"] == {"value": "required"}
    assert table["--runner"]["choices"] == ["auto", "generate", "pooling"]
    assert "--num-iters" not in table  # another subcommand's option is not serve's


SGLANG_FIELDS = '''
class Parallel(msgspec.Struct):
    _NS_PATH = "parallel"
    tp_size: A[int, Arg(help="TP.", aliases=["--tensor-parallel-size"])] = 1
    nnodes: A[int, "The number of nodes."] = 1
    enable_metrics: A[bool, "Metrics."] = False
    load_format: A[Literal["auto", "pt"], "Format."] = "auto"
    hidden: A[int, Arg(help="x", no_cli=True)] = 0
    plain: int = 0
'''

SGLANG_SERVER_ARGS = '''
CHOICES = ["a", "b"]

class ServerArgs:
    @staticmethod
    def add_cli_args(parser):
        parser.add_argument("--backend", type=str, choices=CHOICES + ["c"])
        parser.add_argument("--enable-x", action=argparse.BooleanOptionalAction)
'''


def test_sglang_namespace_fields_and_add_argument_calls() -> None:
    index = pyargs.Index.build([("sglang/srt/arg_groups/fields/parallel.py", SGLANG_FIELDS),
                                ("sglang/srt/server_args.py", SGLANG_SERVER_ARGS)])
    table = pyargs.table([
        *pyargs.add_argument_options(index, ["sglang/srt/server_args.py"]),
        *pyargs.annotated_field_options(index, ["sglang/srt/arg_groups/fields/parallel.py"]),
    ])
    assert table["--tp-size"] == {"value": "required"}
    assert table["--tensor-parallel-size"]["canonical"] == "--tp-size"
    assert table["--enable-metrics"] == {"value": "none"}  # store_true: no --no- form
    assert table["--load-format"] == {"value": "required", "choices": ["auto", "pt"]}
    assert table["--backend"] == {"value": "required", "choices": ["a", "b", "c"]}
    assert table["--no-enable-x"]["canonical"] == "--enable-x"
    assert "--hidden" not in table and "--plain" not in table and "--tp" not in table


ARG_CPP = r'''
static std::initializer_list<enum llama_example> mm_examples = {
    LLAMA_EXAMPLE_MTMD, LLAMA_EXAMPLE_SERVER,
};
    add_opt(common_arg(
        {"-fa", "--flash-attn"}, "[on|off|auto]",
        string_format("set Flash Attention use (default: '%s')", "auto"),
        [](common_params & params, const std::string & value) { params.x = value; }
    ).set_env("LLAMA_ARG_FLASH_ATTN"));
    add_opt(common_arg(
        {"--jinja"},
        {"--no-jinja"},
        "whether to use jinja (default: %s)",
        [](common_params & params, bool value) { params.use_jinja = value; }
    ).set_examples({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg(
        {"--verbose-prompt"},
        "print a verbose prompt before generation (default: false)",
        [](common_params & params) { params.verbose_prompt = true; }
    ));
    add_opt(common_arg(
        {"--mmproj"}, "FILE", "path to a multimodal projector file",
        [](common_params & params, const std::string & value) { params.mmproj = value; }
    ).set_examples(mm_examples));
    add_opt(common_arg(
        {"--cli-only"}, "N", "not for the server",
        [](common_params & params, int value) { params.n = value; }
    ).set_examples({LLAMA_EXAMPLE_CLI}));
    add_opt(common_arg(
        {"--no-server"}, "never on the server",
        [](common_params & params) { params.x = 1; }
    ).set_excludes({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg(
        {"--lora-scaled"}, "FNAME", "SCALE", "two values (a \"quoted\", comma)",
        [](common_params & params, const std::string & a, const std::string & b) {}
    ));
    add_opt(common_arg(
        {"--preset-thing"}, "X", "preset only",
        [](common_params & params, const std::string & value) {}
    ).set_preset_only());
'''


def test_llama_cpp_options_for_the_server() -> None:
    table = cppargs.table(cppargs.options(ARG_CPP))
    assert table["--flash-attn"] == {"value": "required"}
    assert table["-fa"] == {"value": "required", "canonical": "--flash-attn"}
    assert table["--jinja"] == {"value": "none", "negation": "--no-jinja"}
    assert table["--no-jinja"] == {"value": "none", "canonical": "--jinja"}
    assert table["--verbose-prompt"] == {"value": "none"}
    assert table["--mmproj"] == {"value": "required"}
    assert table["--lora-scaled"] == {"value": "required", "values": 2}
    assert not {"--cli-only", "--no-server", "--preset-thing"} & set(table)
