"""Job files: TOML mapped onto torchtitan's dataclass config.

torchtitan 0.3.0 configures jobs with Python dataclasses only. A job file
names the model in ``[model]`` (name, flavor, attn_backend, or hf_path: a HF
model folder, see skrull_ext/hf/job.py), puts root-level
fields (dump_folder, ...) in ``[job]``, and otherwise has one table per
config field of the trainer (``[training]``, ``[parallelism]``,
``[dataloader]``, ``[skrull]``, ...), keys being the dataclass field names.
A ``kind`` key switches a section's class where several exist (see
``SECTION_KINDS``). Every key and value is checked against the dataclass
annotations before anything is built, and errors name the dotted key and
what it allows. ``load_job`` starts from ``base_config``;
CLI flags are applied afterwards by ``JobConfigManager``, through the same
code (skrull_ext/train/job/job_flags.py), so they override the file.
"""

import dataclasses
import difflib
import os
import sys
import types
import typing
from typing import Any

import tomllib
from torchtitan.components.checkpointer import CheckpointManager
from torchtitan.components.loss import CrossEntropyLoss
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw
from torchtitan.config import TrainingConfig
from torchtitan.config.manager import ConfigManager, custom_registry
from torchtitan.models.common.config_utils import decoder_vocab_size
from torchtitan.protocols.model_spec import ModelSpec
from torchtitan.trainer import Trainer

import torchtitan_patches
from skrull_ext.data.steps.loader import SkrullDataLoader
from skrull_ext.data.steps.packed import PackedDataLoader
from skrull_ext.data.sources.tokenizer import SyntheticTokenizer
from skrull_ext.errors import JobFileError
from skrull_ext.hf.job import hf_job_defaults
from skrull_ext.models.registry import build_model_spec
from skrull_ext.train.job.job_checks import check_job
from skrull_ext.train.job.job_config import JobConfig
from skrull_ext.train.job.job_flags import Flag, FlagText, flag_tables
from skrull_ext.train.job.job_help import job_help
from skrull_ext.train.job.loss_config import HeadLossConfig
from skrull_ext.train.job.section_kinds import SECTION_KINDS, register_kind
from skrull_ext.train.job.usage import USAGE, entry_module, exit_without_job, remember_job


MODEL_KEYS = ("name", "flavor", "attn_backend", "hf_path")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


QUOTED = "a quoted number is a string in TOML"


def _quoted(value, key: str, tp: type) -> str:
    """Why a number arrived as a string: it was quoted in the job file (``lookahead = "8"``).
    Said only where the unquoted value is one of ``tp`` (``bucket_size = "1.5"`` is no integer
    either way) and the string came from the file, not a flag (``FlagText``)."""
    if not isinstance(value, str) or isinstance(value, FlagText):
        return ""
    try:
        tp(value)
    except ValueError:
        return ""
    return f" ({QUOTED}: write {key.rsplit('.', 1)[-1]} = {value.strip()} without quotes)"


ACCEPTS: dict[Any, list[str]] = {bool: ["true", "false"], int: ["an integer"], float: ["a number"], str: ["a string"]}
"""What a value of a plain type is, as a union's error lists its members' (``_accepts``)."""


def _accepts(tp: Any) -> list[str] | None:
    """The values ``tp`` takes, in words (``Literal``: each value), for a union's one-line error;
    None where words would say less than the member's own error (an array, a table)."""
    if typing.get_origin(tp) is typing.Literal:
        return [repr(v) for v in typing.get_args(tp)]
    return ACCEPTS.get(tp)


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check a TOML value against annotation ``tp``; return it converted."""
    if isinstance(value, Flag):
        value = value.read(tp, key)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin is typing.Annotated:  # a string in its metadata: what to write instead, told with the error
        try:
            return _coerce(value, args[0], key)
        except JobFileError as e:
            raise JobFileError("; ".join([str(e), *(m for m in args[1:] if isinstance(m, str))])) from None
    if origin is typing.Literal:
        if value not in args:
            raise JobFileError(f"{key}: {value!r} is not one of {list(args)}")
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:  # a flag's "none"
            return None
        errors = []
        for member in args:
            if member is type(None):
                continue
            try:
                return _coerce(value, member, key)
            except JobFileError as e:
                errors.append(str(e).split(": ", 1)[-1])
        quoted = [e for e in errors if QUOTED in e]
        if quoted:  # lookahead = "8": the quotes are the mistake, not the value
            raise JobFileError(f"{key}: {quoted[0]}")
        accepted = [_accepts(m) for m in args if m is not type(None)]
        if all(accepted):  # bool | Literal["auto"]: "expected true, false or 'auto', got 'maybe'"
            said = [a for alts in accepted for a in alts]
            raise JobFileError(f"{key}: expected {', '.join(said[:-1])} or {said[-1]}, got {value!r}")
        raise JobFileError(f"{key}: {value!r} matches none of: {'; '.join(errors)}")
    if tp is bool:
        if not isinstance(value, bool):
            raise JobFileError(f"{key}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise JobFileError(f"{key}: expected an integer, got {value!r}{_quoted(value, key, int)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise JobFileError(f"{key}: expected a number, got {value!r}{_quoted(value, key, float)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise JobFileError(f"{key}: expected a string, got {value!r}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise JobFileError(f"{key}: expected an array, got {value!r}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                raise JobFileError(f"{key}: expected {len(args)} items, got {len(value)}")
            return tuple(_coerce(v, t, f"{key}[{i}]") for i, (v, t) in enumerate(zip(args, value)))
        item = args[0] if args else Any
        out = [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(out) if origin is tuple else out
    if origin is dict:
        if not isinstance(value, dict):
            raise JobFileError(f"{key}: expected a table, got {value!r}")
        return dict(value)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise JobFileError(f"{key}: expected a table, got {value!r}")
        return _build(tp, value, key)
    raise JobFileError(f"{key}: type {_type_name(tp)} cannot be set from a job file")


def settable_fields(cls: type) -> dict[str, Any]:
    """The fields of ``cls`` a job file or flag may set (their annotations): ``init``
    fields not named ``_x``. ``--help`` lists these (job_help.py)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return {
        f.name: hints[f.name]
        for f in dataclasses.fields(cls)
        if f.init and not f.name.startswith("_")
    }


def _check_keys(table: dict, allowed, key: str) -> None:
    """Refuse keys ``table`` has that ``allowed`` lacks, naming the closest allowed one
    for each typo (``[skrul]``: did you mean 'skrull'?), as the flags do (job_flags)."""
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        where = f"[{key}]" if key else "the job file"
        near = {k: m[0] for k in unknown if (m := difflib.get_close_matches(k, [str(a) for a in allowed], n=1))}
        guesses = [repr(m) if len(unknown) == 1 else f"{m!r} for {k!r}" for k, m in near.items()]
        hint = f" (did you mean {', '.join(guesses)}?)" if guesses else ""
        raise JobFileError(
            f"unknown key(s) {unknown} in {where}{hint}; allowed: {sorted(allowed)}"
        )


def _updates(cls: type, current: Any, table: dict, key: str) -> dict[str, Any]:
    fields = settable_fields(cls)
    _check_keys(table, fields, key)
    out = {}
    for name, value in table.items():
        sub = f"{key}.{name}" if key else name
        old = getattr(current, name, None) if current is not None else None
        if isinstance(value, dict) and old is not None and dataclasses.is_dataclass(old):
            out[name] = _apply(old, value, sub)
        else:
            out[name] = _coerce(value, fields[name], sub)
    return out


def _validated(make, key: str):
    try:
        return make()
    except JobFileError:
        raise
    except (ValueError, TypeError) as e:  # the section's own check; ours name the key already
        raise JobFileError(str(e) if str(e).startswith(f"{key}.") else f"[{key}]: {e}") from e


def _build(cls: type, table: dict, key: str) -> Any:
    """A new ``cls`` from a table (e.g. one entry of an array of tables)."""
    kwargs = _updates(cls, None, table, key)
    return _validated(lambda: cls(**kwargs), key)


def _apply(current: Any, table: dict, key: str) -> Any:
    """``current`` with the table's keys set (a validated copy)."""
    table = dict(table)
    if "kind" in table:
        kinds = SECTION_KINDS.get(key.rsplit(".", 1)[-1])
        kind = table.pop("kind")
        kind = kind.read(str, f"{key}.kind") if isinstance(kind, Flag) else kind
        if kinds is None:
            raise JobFileError(f"{key}.kind: [{key}] has no kinds to choose from")
        if kind not in kinds:
            raise JobFileError(f"{key}.kind: {kind!r} is not one of {sorted(kinds)}")
        if kinds[kind] is None:
            if table:
                raise JobFileError(f"[{key}] kind = {kind!r} takes no other keys")
            return None
        new_cls = kinds[kind]
        if type(current) is not new_cls:
            current = _validated(new_cls, key)
    updates = _updates(type(current), current, table, key)
    return _validated(lambda: dataclasses.replace(current, **updates), key)


def base_config(
    model_spec: ModelSpec, config_cls: type[Trainer.Config] = JobConfig
) -> Trainer.Config:
    """Defaults shared by every skrull-ext job; vocab sizes follow the model.

    The last checkpoint keeps the full training state (torchtitan's default
    keeps only the model), so a finished run continues with a larger
    ``--training.steps`` instead of failing on ``dataloader.step``. A job that
    saves the last step as HF weights (``last_save_in_hf``, in the file or on
    the command line) gets a model-only last save, which torchtitan requires.
    """
    vocab = decoder_vocab_size(model_spec)
    return config_cls(
        model_spec=model_spec,
        hf_assets_path="",
        tokenizer=SyntheticTokenizer.Config(vocab_size=vocab),
        # The head and loss in chunks of tokens (train/head_loss.py), the chunk from the memory model.
        loss=HeadLossConfig(loss_fn=CrossEntropyLoss.Config(global_vocab_size=vocab)),
        dataloader=(
            SkrullDataLoader.Config()
            if issubclass(config_cls, JobConfig)
            else PackedDataLoader.Config()
        ),
        optimizer=default_adamw(lr=8e-4),
        lr_scheduler=LRSchedulersContainer.Config(warmup_steps=2),
        training=TrainingConfig(),
        metrics=MetricsProcessor.Config(log_freq=1),
        checkpoint=CheckpointManager.Config(last_save_model_only=False),
    )


def _resolve_profile_path(table: dict, job_path: str) -> None:
    """A relative ``[skrull] cost_model`` profile path that does not exist from
    the current directory is taken relative to the job file, so a shipped job
    finds its profile (``../../profiles/...``) from any directory."""
    skrull = table.get("skrull")
    value = skrull.get("cost_model") if isinstance(skrull, dict) else None
    if not isinstance(value, str) or not value.endswith(".toml") or os.path.isabs(value) or os.path.isfile(value):
        return
    beside = os.path.join(os.path.dirname(os.path.abspath(job_path)), value)
    if os.path.isfile(beside):
        skrull["cost_model"] = os.path.normpath(beside)


def load_job(path: str, *, config_cls=None, ignore: tuple[str, ...] = (),
             model_overrides: dict | None = None):
    """Read a TOML job file into a ``config_cls`` instance (JobConfig
    by default), starting from ``base_config``. Sections named in ``ignore``
    are skipped. ``model_overrides``: ``[model]`` keys that replace the file's (the CLI's
    ``--model.hf_path DIR``; a replaced hf_path drops the file's name/flavor)."""
    config_cls = config_cls or JobConfig
    try:
        with open(path, "rb") as f:
            table = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise JobFileError(f"{path}: not valid TOML: {e}") from e
    except OSError as e:
        raise JobFileError(f"--config-file {path}: {e.strerror}") from e
    for name in ignore:
        table.pop(name, None)
    _resolve_profile_path(table, path)

    model = table.pop("model", {})
    if model_overrides:
        _check_keys(model_overrides, MODEL_KEYS, "model")
        if "hf_path" in model_overrides:  # another folder: its config.json names the model
            model = {k: v for k, v in model.items() if k not in ("name", "flavor")}
        model = {**model, **model_overrides}
    _check_keys(model, MODEL_KEYS, "model")
    required = () if "hf_path" in model else ("name", "flavor")  # hf_path: from config.json
    for name in required:
        if name not in model:
            raise JobFileError(f"model.{name}: required (one of the keys {list(MODEL_KEYS)})")
    try:
        spec = build_model_spec(**model)
    except ValueError as e:
        raise JobFileError(str(e)) from e
    config = base_config(spec, config_cls)
    if "hf_path" in model:
        config = hf_job_defaults(config, model["hf_path"])

    sections, scalars = sections_and_scalars(config)
    job = table.pop("job", {})
    _check_keys(job, scalars, "job")
    _check_keys(table, sections | {"job", "model"}, "")  # root scalars live in [job] only
    return apply_tables(config, {**table, **job}, where="job")


def sections_and_scalars(config: Any) -> tuple[set[str], set[str]]:
    """The root fields set by a table (``[training]``) and those set by a value (``[job]``)."""
    root_fields = settable_fields(type(config))
    sections = {
        n
        for n in root_fields
        if n != "model_spec"
        and (dataclasses.is_dataclass(getattr(config, n)) or n in SECTION_KINDS)
    }
    return sections, set(root_fields) - sections - {"model_spec"}


def _is_true(value: Any) -> bool:
    try:
        return (value.read(bool, "") if isinstance(value, Flag) else value) is True
    except JobFileError:
        return False


def apply_tables(config: Any, table: dict, *, where: str, given: dict[str, list[str]] | None = None) -> Any:
    """``config`` with a job file's tables (or the flags read as tables, see
    job_flags) applied: one validated copy. Root scalars sit beside the tables
    (a job file's ``[job]``). What one key implies for another is set here
    once for both: a ``[lora]`` table means LoRA training; a HF last save
    holds the model only (torchtitan requires it). ``given``: per section, the
    flags that set it, named when the section's own check refuses them."""
    sections, scalars = sections_and_scalars(config)
    root_fields = settable_fields(type(config))
    _check_keys(table, sections | scalars, "")
    updates = {}
    for name, value in table.items():
        if name in scalars:
            updates[name] = _coerce(value, root_fields[name], f"{where}.{name}" if where else name)
            continue
        if not isinstance(value, dict):
            raise JobFileError(f"{name}: expected a [{name}] table, got {value!r}")
        value = dict(value)
        if name == "lora":
            value.setdefault("enable", True)
        if name == "checkpoint" and _is_true(value.get("last_save_in_hf")):
            value.setdefault("last_save_model_only", True)
        current = getattr(config, name)
        if current is None:  # e.g. activation_checkpoint disabled in the base
            if "kind" not in value:
                raise JobFileError(f"[{name}] is off in the base config; set its kind")
            current = next(c for c in SECTION_KINDS[name].values() if c is not None)()
        try:
            updates[name] = _apply(current, value, name)
        except JobFileError as e:
            flags = (given or {}).get(name)
            if flags and str(e).startswith("["):  # the section's own check: it cannot name the flags
                raise JobFileError(f"{e} (given: {', '.join(flags)})") from e
            raise
    return _validated(lambda: dataclasses.replace(config, **updates), "job")


class JobConfigManager(ConfigManager):
    """torchtitan's ConfigManager plus ``--config-file JOB.toml``.

    Precedence: CLI flags > job file > ``base_config`` defaults. Without
    ``--config-file`` it behaves exactly like torchtitan's (``--module``,
    ``--config``). ``--model.KEY VALUE`` replaces a ``[model]`` key of the
    job file (``--model.hf_path /models/Qwen2.5-7B-Instruct``: the shipped
    fine-tuning jobs name a placeholder folder).
    """

    def __init__(self, module: str | None = None):
        super().__init__()
        self.module = module or entry_module()
        """The entry point ``--help`` names (``python -m skrull_ext.train``); None: the module
        ``python -m`` ran (usage.entry_module)."""

    def _load_config(self, args: list[str]) -> tuple[object, list[str]]:
        path, rest, model = None, [], {}
        it = iter(args)
        for arg in it:
            if arg.startswith("--model."):  # [model] is read by load_job, not a config field the flags set
                key, eq, value = arg[len("--model."):].partition("=")
                value = value if eq else next(it, None)
                if value is None:
                    raise ValueError(f"--model.{key} requires a value")
                model[key.replace("-", "_")] = value
            elif arg.startswith("--config-file=") or arg.startswith("--config_file="):
                path = arg.split("=", 1)[1]
            elif arg in ("--config-file", "--config_file"):
                path = next(it, None)
                if path is None:
                    raise ValueError("--config-file requires a path")
            else:
                rest.append(arg)
        if path is None:
            if model:
                raise ValueError(f"--model.{next(iter(model))} needs --config-file (it sets the job file's [model])")
            return super()._load_config(args)
        return load_job(path, model_overrides=model), rest

    def parse_args(self, args: list[str] | None = None):
        """The job with its flags applied (job_flags); ``--help`` prints every key the
        job can set (job_help.py), with the flags given beside it applied, and exits 0."""
        args = sys.argv[1:] if args is None else args
        config, rest = self._load_config(args)
        if any(a in ("-h", "--help") for a in rest):  # what the parser accepts, nothing else (job_help.py)
            rest = [a for a in rest if a not in ("-h", "--help")]
            if rest:  # the flags given with --help: their values in the listing, or their error
                tables, given = flag_tables(config, rest, SECTION_KINDS)
                config = apply_tables(config, tables, where="", given=given)
            job = next((a.split("=", 1)[1] if "=" in a else b for a, b in zip(args, [*args[1:], ""])
                        if a.startswith(("--config-file", "--config_file"))), "JOB.toml")
            sections, scalars = sections_and_scalars(config)
            print(job_help(config, job, sections=sections, scalars=scalars, kinds=SECTION_KINDS,
                           model_keys=MODEL_KEYS, settable=settable_fields, module=self.module), end="")
            raise SystemExit(0)
        tables, given = flag_tables(config, rest, SECTION_KINDS)
        self.config = apply_tables(config, tables, where="", given=given)
        self._validate_config()
        return self.config


def load_config(argv: list[str] | None = None, *, module: str | None = None,
                world_size: int | None = None, check: bool = True):
    """The job config of a command line, for every skrull-ext entry point
    (training, profiler, checks), with the CPU fixes applied
    (``torchtitan_patches.apply``: this is where a command line gets them,
    before ``check_job`` and whatever the tool builds). The whole config is then
    checked against this launch (``job_checks.check_job``; ``world_size``
    overrides ``WORLD_SIZE``, e.g. for a profile of a larger job; ``check``
    false skips that: a tool that only reads the job's data, ahead of the
    launch, does not know its world).

    Without a job (no ``--config-file``/``--module``) it prints the usage of
    ``python -m module`` (the entry point; None: the module ``python -m`` ran) and
    exits (0 for ``--help``, else 2). Raises ``JobFileError`` for a bad key or
    value, whether from the file or a flag.
    """
    argv = sys.argv[1:] if argv is None else argv
    module = module or entry_module()
    exit_without_job(argv, module)
    try:
        config = JobConfigManager(module).parse_args(argv)
    except JobFileError:
        raise
    except (ValueError, TypeError) as e:  # a __post_init__ check, or torchtitan's --module/--config
        raise JobFileError(str(e)) from e
    remember_job(argv)  # for a command the job's lines suggest on it (usage.job_args)
    try:
        torchtitan_patches.apply(config)
    except ValueError as e:  # a setting this torch cannot run (compat.check_config)
        raise JobFileError(str(e)) from e
    if check:
        check_job(config, world_size)
    return config


__all__ = ["USAGE", "JobConfigManager", "JobFileError", "base_config", "custom_registry", "load_config", "load_job",
           "register_kind"]
