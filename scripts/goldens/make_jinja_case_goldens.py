#!/usr/bin/env python3
"""Goldens for the Jinja interpreter's unit cases (tests/unit/jinja_test.cpp): small templates, each exercising
one feature (whitespace control, scoping, loop variables, slicing, Python repr, tojson, string methods, filters,
tests, operators, macros), rendered by transformers' own Jinja environment (trim_blocks, lstrip_blocks, its
tojson). Writes tests/data/chat_templates/jinja_cases.json.

Run with the project venv:  /root/.cache/axengine/venv/bin/python scripts/goldens/make_jinja_case_goldens.py
"""
import json
import os

from transformers.utils.chat_template_utils import _compile_jinja_template

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "chat_templates",
                   "jinja_cases.json")
cases = [
 ("ws", "  {% if true %}\n  x\n  {% endif %}\n{{- ' y ' -}}\n  z", {}),
 ("scope", "{% set a = 1 %}{% for i in [1,2] %}{% set a = i %}{% endfor %}{{ a }}|{% set ns = namespace(a=1) %}{% for i in [1,2] %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}", {}),
 ("loop", "{% for x in xs %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }};{% endfor %}", {"xs": ["a","b","c"]}),
 ("loopfilter", "{% for k, v in d.items() if k != 'b' %}{{ loop.index }}{{ k }}={{ v }},{% else %}none{% endfor %}{% for x in [] %}x{% else %}empty{% endfor %}", {"d": {"a": 1, "b": 2, "c": 3}}),
 ("breakcont", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}", {}),
 ("slice", "{{ s[1:3] }}|{{ s[::-1] }}|{{ s[-2:] }}|{{ xs[1:] }}|{{ xs[::2] }}|{{ s|length }}|{{ s[0] }}", {"s": "héllo🙂", "xs": [1,2,3,4]}),
 ("repr", "{{ [1, 'a', none, true, 2.5, {'k': \"it's\"}] }}|{{ none }}|{{ 1.0 }}|{{ 1e20 }}|{{ 0.0001 }}|{{ 10 / 4 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ -7 % 3 }}|{{ 2 ** 10 }}", {}),
 ("tojson", "{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ d|tojson(sort_keys=true) }}|{{ d|tojson(separators=(',', ':')) }}|{{ 'ü\"\\n'|tojson }}|{{ [] | tojson(indent=2) }}", {"d": {"z": 1, "a": [1.5, None, True, "é"], "e": {}}}),
 ("strmeth", "{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '\\n\\na'.lstrip('\\n') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'abc'.startswith('ab') }}|{{ 'abc'.endswith(('x','c')) }}|{{ 'aXa'.replace('a','b') }}|{{ 'Hé'.upper() }}{{ 'Hé'.lower() }}|{{ 'a b'.title() }}|{{ 'a</think>b'.split('</think>')[-1] }}", {}),
 ("filters", "{{ '  x '|trim }}|{{ u|default('d') }}|{{ ''|default('d', true) }}|{{ [1,2]|join('-') }}|{{ xs|selectattr('r', 'equalto', 'u')|list|length }}|{{ xs|rejectattr('r', 'equalto', 'u')|map(attribute='r')|join }}|{{ 'ab'|upper }}|{{ 3|string ~ 4 }}|{{ xs|first|tojson }}|{{ xs|last }}", {"xs": [{"r": "u"}, {"r": "a"}, {"r": "u"}]}),
 ("tests", "{{ u is defined }}{{ none is none }}{{ 's' is string }}{{ {} is mapping }}{{ [] is iterable }}{{ 's' is sequence }}{{ 3 is number }}{{ false is false }}{{ 1 is equalto 1 }}{{ u is iterable }}{{ 4 is divisibleby 2 }}{{ x is not none }}", {"x": 1}),
 ("ops", "{{ 'a' in 'cat' }}{{ 1 in [1,2] }}{{ 'k' in d }}{{ 'z' not in d }}{{ 1 < 2 and 'b' > 'a' }}{{ none or 'x' }}{{ 0 and 1 }}{{ 'a' ~ 1 ~ none }}{{ 'y' if u else 'n' }}{{ [1] + [2] }}{{ 'ab' * 2 }}{{ not 0 }}", {"d": {"k": 1}}),
 ("macro", "{% macro m(a, b='B') %}[{{ a }}{{ b }}{{ c }}]{% endmacro %}{% set c = 'C' %}{{ m(1) }}{{ m(1, b=2) }}{{ m('x', 'y') }}", {}),
 ("macro_rec", "{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}", {}),
 ("setblock", "{% set x %}a{{ 1 + 1 }}b{% endset %}{{ x }}|{% set a, b = [1, 2] %}{{ b }}{{ a }}", {}),
 ("comments", "a {# c #}\n  {#- c -#}  b\n{# x #}\nc", {}),
 ("dictmeth", "{{ d.get('a') }}{{ d.get('zz', 'dflt') }}{{ d.keys()|list }}{{ d['a'] }}{{ d.a }}{{ d.missing is defined }}", {"d": {"a": 1}}),
 ("lstrip_inline", "x  {% if true %}y{% endif %}\n    {%+ if true %}z{% endif %}", {}),
 ("dictlit", "{{ {'a': 1, 'b': [1, 2]} | tojson }}{{ dict(x=1)|tojson }}{{ (1, 2)|list }}", {}),
 ("newlines", "line\r\n  {% if true %}\r\nz{% endif %}\r{% if true %}a{% endif %}\n\n  {% if true %}\n b\n{% endif %}  \n", {}),
 ("braces_in_tags", "{{ '%}' }}{{ '}}' }}{{ {'a': {'b': 1}} }}{% macro f() -%}\n  X\n{%- endmacro %}[{{ f() }}]", {}),
 ("numbers", "{{ 3 / 2 }}{{ 2 ** -1 }}{{ 1e3 }}{{ 0.1 + 0.2 }}{{ 1 == 1.0 }}{{ [1,2] == [1,2] }}{{ -3 // 2 }}{{ -3 % 2 }}{{ 7.5 // 2 }}{{ -7.5 % 2 }}{{ 10 // -3 }}{{ 1.5e300 * 10 }}", {}),
 ("unicode", "{{ s|length }}{{ s|trim }}|{{ s|reverse }}|{{ s.strip() }}", {"s": "\u3000日本\u00a0"}),
]


def main():
    out = []
    for name, template, ctx in cases:
        out.append({"name": name, "template": template, "context": ctx,
                    "expected": _compile_jinja_template(template).render(**ctx)})
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(out)} cases")


if __name__ == "__main__":
    main()
