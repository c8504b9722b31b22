#!/usr/bin/env python3
"""Golden renderings of the chat templates in tests/fixtures/chat_templates, as transformers makes them.

For every template of templates.json and every conversation of its groups (conversations.json), with
add_generation_prompt false and true, this renders the template the way
`tokenizer.apply_chat_template(messages, tools=..., documents=..., add_generation_prompt=..., tokenize=False,
**variables)` does and writes one JSON line per rendering to golden.jsonl:

  {"template": ..., "conversation": ..., "add_generation_prompt": ..., "text": ...}   or  ..., "error": ...}

With transformers installed, its own render_jinja_template renders (transformers.utils.chat_template_utils).
Without it, the same Jinja environment is built here from jinja2 as transformers builds it (ImmutableSandboxedEnvironment,
trim_blocks and lstrip_blocks, the loopcontrols extension, the {% generation %} block, tojson through
json.dumps(ensure_ascii=False), raise_exception, strftime_now). Both give the same text; --check compares this
environment with transformers where both are installed.

strftime_now reads a fixed clock, 2024-07-26 12:00:00 (the C++ test sets the same), so dates are reproducible.
The special tokens transformers passes (tokenizer.special_tokens_map: bos_token, eos_token, unk_token, pad_token,
additional_special_tokens, ... those set) are each template's "special_tokens" in templates.json.

It also renders the short templates of snippets.json (one construct or two each, over
messages=[{"role": "user", "content": "hi"}]) into snippets_golden.jsonl: the engine's tests compare with them
construct by construct.

Usage: tools/oracle/chat_template_golden.py [--fixtures DIR] [--check]
"""
import argparse
import datetime as datetime_module
import json
import sys
from pathlib import Path

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXED_NOW = datetime_module.datetime(2024, 7, 26, 12, 0, 0)


class FixedClock(datetime_module.datetime):
    @classmethod
    def now(cls, tz=None):
        return FIXED_NOW


class GenerationBlock(Extension):
    """transformers' AssistantTracker without tracking: {% generation %}...{% endgeneration %} renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def compile_like_transformers(source):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return FixedClock.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def render_here(source, messages, tools, documents, add_generation_prompt, variables):
    template = compile_like_transformers(source)
    return template.render(messages=messages, tools=tools, documents=documents,
                           add_generation_prompt=add_generation_prompt, **variables)


def render_with_transformers(source, messages, tools, documents, add_generation_prompt, variables):
    from transformers.utils import chat_template_utils

    chat_template_utils.datetime = FixedClock  # strftime_now calls datetime.now()
    chat_template_utils._compile_jinja_template.cache_clear() if hasattr(
        chat_template_utils._compile_jinja_template, "cache_clear") else None
    rendered, _ = chat_template_utils.render_jinja_template(
        conversations=[messages], tools=tools, documents=documents, chat_template=source,
        add_generation_prompt=add_generation_prompt, **variables)
    return rendered[0]


def have_transformers():
    try:
        from transformers.utils import chat_template_utils  # noqa: F401
        return hasattr(chat_template_utils, "render_jinja_template")
    except ImportError:
        return False


def cases(fixtures):
    """(template, source, conversation, add_generation_prompt, messages, tools, documents, variables) to render."""
    templates = json.loads((fixtures / "templates.json").read_text(encoding="utf-8"))
    groups = json.loads((fixtures / "conversations.json").read_text(encoding="utf-8"))
    tool_sets = groups.pop("tool_sets")
    for t in templates:
        source = (fixtures / "templates" / f"{t['name']}.jinja").read_text(encoding="utf-8")
        for group in t["conversations"]:
            for c in groups[group]:
                tools = tool_sets[c["tools"]] if "tools" in c else None
                variables = {**t["special_tokens"], **c.get("variables", {})}
                for add_generation_prompt in (False, True):
                    yield (t["name"], source, c["name"], add_generation_prompt, c["messages"], tools,
                           c.get("documents"), variables)


SNIPPET_MESSAGES = [{"role": "user", "content": "hi"}]


def render_case(render, case):
    _, source, _, add_generation_prompt, messages, tools, documents, variables = case
    try:
        return {"text": render(source, messages, tools, documents, add_generation_prompt, variables)}
    except Exception as e:  # what transformers raises: TemplateError, UndefinedError, TypeError, ...
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fixtures", type=Path,
                        default=Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "chat_templates")
    parser.add_argument("--check", action="store_true",
                        help="compare golden.jsonl with transformers' rendering instead of writing it")
    args = parser.parse_args()
    use_transformers = have_transformers()
    render = render_with_transformers if use_transformers else render_here
    golden_path = args.fixtures / "golden.jsonl"
    if args.check:
        if not use_transformers:
            sys.exit("--check needs transformers")
        golden = [json.loads(line) for line in golden_path.read_text(encoding="utf-8").splitlines()]
        differ = 0
        for case, line in zip(cases(args.fixtures), golden, strict=True):
            got = render_case(render, case)
            if got.get("text") != line.get("text") or ("error" in got) != ("error" in line):
                differ += 1
                print(f"DIFFERS {case[0]} / {case[2]} / add_generation_prompt={case[3]}:\n"
                      f"  transformers: {json.dumps(got, ensure_ascii=False)[:400]}\n"
                      f"  golden:       {json.dumps(line, ensure_ascii=False)[:400]}")
        print(f"{len(golden)} renderings, {differ} differ from transformers")
        sys.exit(1 if differ else 0)
    snippet_lines = []
    for source in json.loads((args.fixtures / "snippets.json").read_text(encoding="utf-8")):
        line = {"template": source}
        line.update(render_case(render, ("", source, "", False, SNIPPET_MESSAGES, None, None, {})))
        snippet_lines.append(json.dumps(line, ensure_ascii=False))
    (args.fixtures / "snippets_golden.jsonl").write_text("\n".join(snippet_lines) + "\n", encoding="utf-8")
    lines = []
    for case in cases(args.fixtures):
        line = {"template": case[0], "conversation": case[2], "add_generation_prompt": case[3]}
        line.update(render_case(render, case))
        lines.append(json.dumps(line, ensure_ascii=False))
    golden_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    errors = sum('"error"' in line for line in lines)
    print(f"{golden_path}: {len(lines)} renderings ({errors} errors) with "
          f"{'transformers' if use_transformers else 'jinja2 ' + jinja2.__version__ + ' as transformers sets it up'}")


if __name__ == "__main__":
    main()
