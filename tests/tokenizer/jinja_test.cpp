// The Jinja engine under the chat templates, construct by construct; each expected text is what jinja2 3.1
// renders in transformers' environment (trim_blocks, lstrip_blocks, tojson through json.dumps).
#include <gtest/gtest.h>

#include "tokenizer/jinja_template.h"
#include "tokenizer_test_util.h"

namespace microllm::testing {
namespace {

using ::testing::HasSubstr;

std::string render(std::string_view source, std::string_view variables_json = "{}") {
  const jinja::Value variables = jinja::value_from_json_text(variables_json, "variables");
  return jinja::Template(source).render(variables.as_dict(), {.now_unix_seconds = 1721995200});
}

TEST(Jinja, WhitespaceControl) {
  // trim_blocks drops the newline after a block tag; lstrip_blocks the indent before it.
  EXPECT_EQ(render("{% if true %}\n    yes\n    {% endif %}\nend"), "    yes\nend");
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(render("{{ 'x' }}\n{{ 'y' }}\n"), "x\ny");  // no trim after }}; one trailing newline dropped
  EXPECT_EQ(render("a\n  {{- 'b' }}"), "ab");
  EXPECT_EQ(render("{# comment #}\nx  {#- strip -#}  y"), "xy");
  EXPECT_EQ(render("  {%+ if true %}x{% endif +%}\ny"), "  x\ny");
  EXPECT_EQ(render("a\r\nb"), "a\nb");
  EXPECT_EQ(render("{% raw %}{{ not evaluated }}{% endraw %}"), "{{ not evaluated }}");
}

TEST(Jinja, ExpressionsAsPython) {
  EXPECT_EQ(render("{{ none }}|{{ [1, 'a', none, true, 1.5, {'k': 'v'}] }}|{{ 1e16 }}|{{ 1e-5 }}|{{ 10/4 }}"),
            "None|[1, 'a', None, True, 1.5, {'k': 'v'}]|1e+16|1e-05|2.5");
  EXPECT_EQ(render("{{ 10//4 }}|{{ -7 % 3 }}|{{ 2**10 }}|{{ 7/7 }}|{{ -7.5 // 2 }}|{{ 0.1 + 0.2 }}"),
            "2|2|1024|1.0|-4.0|0.30000000000000004");
  EXPECT_EQ(render("{{ [1,2] + [3] }}{{ 'a' * 3 }}{{ 'a' ~ 1 ~ none }}{{ 'a' 'b' }}"), "[1, 2, 3]aaaa1Noneab");
  EXPECT_EQ(render("{{ true == 1 }}{{ 1 == 1.0 }}{{ 'a' == none }}{{ 1 < 2 < 3 }}{{ 'b' in 'abc' }}{{ 3 not in [1] }}"),
            "TrueTrueFalseTrueTrueTrue");
  EXPECT_EQ(render("{{ 0 or 'x' }}|{{ 1 and [] }}|{{ 'y' if false }}|{{ 'n' if 0 else 'e' }}"), "x|[]||e");
  EXPECT_EQ(render("{{ 'abc'[::-1] }}{{ 'héllo'[1:3] }}{{ [1,2,3][-1] }}{{ [1,2,3][1:] }}{{ x.y.0 }}",
                   R"({"x": {"y": ["z"]}})"),
            "cbaél3[2, 3]z");
  EXPECT_EQ(render("{{ \"it's\" }}|{{ ['it\\'s', 'a\"b', 'q\\n'] }}"), "it's|[\"it's\", 'a\"b', 'q\\n']");
  EXPECT_EQ(render("{{ 'a\\tb\\x41\\u00e9' }}"), "a\tbAé");
}

TEST(Jinja, UndefinedAsJinja) {
  EXPECT_EQ(render("{{ x }}|{{ x|length }}|{{ x ~ 'a' }}|{{ x is defined }}|{{ d.missing is defined }}|{{ 'x' in x }}",
                   R"({"d": {}})"),
            "|0|a|False|False|False");
  EXPECT_THAT(testing::thrown_message<ValueError>([] { render("{{ d.missing.deeper }}", R"({"d": {}})"); }),
              HasSubstr("line 1, column 13: UndefinedError: 'dict object' has no attribute 'missing'"));
  EXPECT_THAT(testing::thrown_message<ValueError>([] { render("{{ 'a' + 1 }}"); }),
              HasSubstr("can only concatenate str (not \"int\") to str"));
  EXPECT_THAT(testing::thrown_message<ValueError>([] { render("{% for m in none %}{% endfor %}"); }),
              HasSubstr("'NoneType' object is not iterable"));
}

TEST(Jinja, LoopsScopesAndNamespaces) {
  // A set inside a loop is local to its iteration; a namespace carries state out.
  EXPECT_EQ(render("{% set c = 0 %}{% for i in [1,2,3] %}{% set c = c + 1 %}{{ c }}{% endfor %}{{ c }}"), "1110");
  EXPECT_EQ(render("{% set ns = namespace(a=1) %}{% for i in [1,2] %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}"),
            "4");
  EXPECT_EQ(render("{% for x in [1,2,3,4] if x > 1 %}{{ loop.index }}/{{ loop.length }}{{ ',' if not loop.last }}"
                   "{% endfor %}"),
            "1/3,2/3,3/3");
  EXPECT_EQ(
      render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }}{{ loop.previtem is defined }} {% endfor %}"),
      "a=1False b=2True ");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in range(5) %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}"
                   "{% endif %}{{ x }}{% endfor %}"),
            "02");
  EXPECT_EQ(render("{% for x in 'ab' %}{{ loop.cycle('o', 'e') }}{{ x }}{% endfor %}"), "oaeb");
}

TEST(Jinja, MacrosCallBlocksAndSetBlocks) {
  EXPECT_EQ(render("{% macro tag(name, v='d') %}<{{ name }}={{ v }}>{% endmacro %}{{ tag('a') }}{{ tag('b', v=2) }}"),
            "<a=d><b=2>");
  EXPECT_EQ(render("{% set x = 1 %}{% macro m() %}{{ x }}{% endmacro %}{% set x = 2 %}{{ m() }}"), "2");
  EXPECT_EQ(render("{% macro box() %}[{{ caller() }}]{% endmacro %}{% call box() %}inside{% endcall %}"), "[inside]");
  EXPECT_EQ(render("{% set block | upper %}  shout  {% endset %}{{ block | trim }}"), "SHOUT");
  EXPECT_EQ(render("{% filter upper %}abc{% endfilter %}"), "ABC");
  EXPECT_EQ(render("{% generation %}kept{% endgeneration %}"), "kept");
}

TEST(Jinja, FiltersAndMethods) {
  const std::string people = R"({"p": [{"n": "b", "a": 2}, {"n": "a", "a": 0}, {"n": "c"}]})";
  EXPECT_EQ(
      render("{{ p | selectattr('a') | map(attribute='n') | join(',') }}|{{ p | rejectattr('a') | list | length }}"
             "|{{ p | selectattr('a', 'equalto', 0) | first }}|{{ p | sort(attribute='n') | map(attribute='n') "
             "| join }}|{{ p | last }}",
             people),
      "b|2|{'n': 'a', 'a': 0}|abc|{'n': 'c'}");
  EXPECT_EQ(
      render("{{ '  x  ' | trim }}|{{ 'Hello World-foo bar(baz' | title }}|{{ 'hELLo' | capitalize }}|"
             "{{ 'a\\nb' | indent(2) }}|{{ 3.7 | int }}|{{ '3' | int + 1 }}|{{ 2.5 | round }}|{{ x | default('d') }}"),
      "x|Hello World-Foo Bar(Baz|Hello|a\n  b|3|4|2.0|d");
  EXPECT_EQ(render("{{ 'a,b,,c'.split(',') }}{{ ' a  b '.split() }}{{ 'x-y-z'.rsplit('-', 1) }}{{ '--a--'.strip('-') }}"
                   "{{ 'abc'.startswith(('x', 'a')) }}{{ 'aXa'.replace('a', 'b') }}{{ '{} and {}'.format(1, 'two') }}"),
            "['a', 'b', '', 'c']['a', 'b']['x-y', 'z']aTruebXb1 and two");
  EXPECT_EQ(render("{{ d.get('k') }}{{ d.get('z', 0) }}{{ d | items | list }}{{ d.keys() | list }}{{ d | dictsort }}",
                   R"({"d": {"k": "v"}})"),
            "v0[('k', 'v')]['k'][('k', 'v')]");
  EXPECT_EQ(render("{{ [3, 1, 2] | sort | reverse | list }}{{ [1, 1, 2] | unique | list }}{{ [1, 2] | sum }}"
                   "{{ ['b', 'A'] | max }}{{ 'Hi' | lower }}{{ 'a b c' | wordcount }}"),
            "[3, 2, 1][1, 2]3bhi3");
}

TEST(Jinja, TojsonAsJsonDumps) {
  const std::string data = R"({"x": {"a": [1, 2.0, "é\n\"\u0001", null, true], "b": {}, "c": []}})";
  EXPECT_EQ(render("{{ x | tojson }}", data), R"({"a": [1, 2.0, "é\n\"\u0001", null, true], "b": {}, "c": []})");
  EXPECT_EQ(render("{{ x | tojson(indent=2) }}", data),
            "{\n  \"a\": [\n    1,\n    2.0,\n    \"é\\n\\\"\\u0001\",\n    null,\n    true\n  ],\n  \"b\": {},\n  "
            "\"c\": []\n}");
  EXPECT_EQ(render("{{ {'b': 1, 'a': 2} | tojson(sort_keys=true, separators=(',', ':')) }}"), R"({"a":2,"b":1})");
  EXPECT_THAT(testing::thrown_message<ValueError>([] { render("{{ x | tojson }}"); }),
              HasSubstr("Object of type Undefined is not JSON serializable"));
}

TEST(Jinja, StrftimeNowAndGlobals) {
  EXPECT_EQ(render("{{ strftime_now('%d %b %Y') }}|{{ strftime_now is defined }}"), "26 Jul 2024|True");
  EXPECT_EQ(render("{{ range(3) | list }}{{ dict(a=1) }}{{ namespace(x=1).x }}"), "[0, 1, 2]{'a': 1}1");
}

TEST(Jinja, SyntaxErrorsNameTheLine) {
  EXPECT_THAT(testing::thrown_message<ParseError>([] { render("ok\n{{ 1 + }}"); }),
              HasSubstr("line 2, column 8: unexpected '}}'"));
  EXPECT_THAT(testing::thrown_message<ParseError>([] { render("{% for x in y %}{% endif %}"); }),
              HasSubstr("expected '{% endfor %}'"));
  EXPECT_THAT(testing::thrown_message<ParseError>([] { render("{{ 'abc }}"); }), HasSubstr("unclosed string literal"));
  EXPECT_THAT(testing::thrown_message<ParseError>([] { render("{# never closed"); }),
              HasSubstr("missing end of comment"));
  EXPECT_THAT(testing::thrown_message<NotSupportedError>([] { render("{% for x in y recursive %}{% endfor %}"); }),
              HasSubstr("recursive for loops"));
  EXPECT_THAT(testing::thrown_message<NotSupportedError>(
                  [] { render("{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}"); }),
              HasSubstr("nesting deeper than 200 levels"));
  EXPECT_THAT(testing::thrown_message<ValueError>([] { render("{{ [].append(1) }}"); }),
              HasSubstr("SecurityError: access to attribute 'append' of 'list' object is unsafe."));
}

// Short templates, one construct or two each, against jinja2's renderings in transformers' environment
// (tests/fixtures/chat_templates/snippets_golden.jsonl, from tools/oracle/chat_template_golden.py).
TEST(Jinja, SnippetsRenderAsJinja2) {
  const auto golden =
      std::filesystem::path(MICROLLM_SOURCE_DIR) / "tests" / "fixtures" / "chat_templates" / "snippets_golden.jsonl";
  size_t texts = 0, errors = 0;
  for (const Json& line : read_json_lines(golden)) {
    const std::string source = line["template"];
    const std::string variables = R"({"messages": [{"role": "user", "content": "hi"}], "tools": null,
                                      "documents": null, "add_generation_prompt": false})";
    if (line.contains("error")) {
      EXPECT_THROW(render(source, variables), ValueError) << source << " (jinja2: " << line["error"] << ")";
      ++errors;
      continue;
    }
    try {
      EXPECT_EQ(render(source, variables), line["text"].get<std::string>()) << source;
    } catch (const Error& e) {
      ADD_FAILURE() << source << ": " << e.what();
    }
    ++texts;
  }
  EXPECT_GE(texts, 90u);
  EXPECT_GE(errors, 5u);
}

TEST(Jinja, BoundedWhereATemplateCouldRunAway) {
  EXPECT_THAT(testing::thrown_message<NotSupportedError>(
                  [] { render("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}"); }),
              HasSubstr("a value nested deeper than 200 levels is not supported"));
  EXPECT_THAT(testing::thrown_message<NotSupportedError>([] { render("{{ 'ab' * 100000000 }}"); }),
              HasSubstr("a string or list longer than 64 Mi"));
  EXPECT_THAT(testing::thrown_message<NotSupportedError>(
                  [] { render("{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}"); }),
              HasSubstr("macro recursion deeper than 200 calls"));
}

}  // namespace
}  // namespace microllm::testing
