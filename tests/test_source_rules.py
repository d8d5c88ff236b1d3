"""The preprocessor rules on the token stream: every known way to name a file or run a pragma is refused."""

from pathlib import Path

import pytest

from megakernel_agent.sandbox.candidate import Candidate, CandidateError, validate
from megakernel_agent.sandbox.source_rules import SourceRuleError, check_source, logical_lines

ROOT = Path(__file__).resolve().parent.parent
OK = "#include <cuda_bf16.h>\n__global__ void k() {}\n"

ATTACKS = {
    "quoted include": '#include "/etc/passwd"\n',
    "header outside the list": "#include <stdio.h>\n",
    "macro include": '#define H "/etc/passwd"\n#include H\n',
    "macro include of an angle name": "#define H <stdio.h>\n#include H\n",
    "include split by a line continuation": '#inc\\\nlude "/etc/passwd"\n',
    "directive after a comment line": '// note\n#include "/etc/passwd"\n',
    "comment inside the directive": '#include /* x */ "/etc/passwd"\n',
    "comment before the hash": '/* x */ #include "/etc/passwd"\n',
    "block comment ending before the directive": '/* a\nb */ #include "/etc/passwd"\n',
    "digraph directive": '%:include "/etc/passwd"\n',
    "include_next": "#include_next <cuda_bf16.h>\n",
    "import": '#import "/etc/passwd"\n',
    "embed": '#embed "/etc/passwd"\n',
    "line directive": '#line 1 "/etc/passwd"\n',
    "_Pragma operator": '_Pragma("message(\\"x\\")")\n',
    "_Pragma in a macro": '#define P _Pragma("once")\n',
    "__has_include": "#if __has_include(</etc/passwd>)\n#endif\n",
    "__has_include_next": "#if __has_include_next(<x>)\n#endif\n",
    "token pasting": "#define CAT(a, b) a##b\n",
    "pasting with a digraph": "#define CAT(a, b) a %:%: b\n",
    "unknown pragma": "#pragma GCC dependency \"/etc/passwd\"\n",
    "pragma message": '#pragma message("x")\n',
    "trigraph hash": '??=include "/etc/passwd"\n',
    "trigraph continuation": "#inc??/\nlude <stdio.h>\n",
    "space after a continuation": '#define A 1 \\  \n#include "/etc/passwd"\n',
    "raw string": 'const char* s = R"(x)";\n',
    "universal character name": "int _Pr\\u0061gma;\n",
    "non-ASCII identifier": "int caf\u00e9;\n",
    "non-ASCII digit": "int x = \u00b2;\n",
    "non-ASCII digit after a dot": "float x = .\u0663;\n",
    "universal character name between digit separators": "int a = 1'2; _Pr\\u0061gma(\"x\") int b = 'c';\n",
    "bare carriage return": '#define A 1\r#include "/etc/passwd"\n',
    "unterminated comment": "/* never closed\n",
    "unterminated string": 'const char* s = "open;\n',
    "NUL byte": "int a;\0\n",
    "ident directive": '#ident "x"\n',
    "include behind a comment spanning lines": '# /*\n*/ include "/etc/hostname"\n',
    "include right after a comment spanning lines": '#/*\n*/include "/etc/passwd"\n',
    "line directive behind a comment spanning lines": '#/*\n*/line 1 "/etc/passwd"\n',
    "pragma behind a comment spanning lines": '#/*\n*/pragma message("runs")\n',
    "angle include behind a spliced comment": '#/* a\n b \\\n c */ include </etc/hostname>\n',
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_is_refused(name):
    with pytest.raises(SourceRuleError, match=r"^line \d+: "):
        check_source(OK + ATTACKS[name])


@pytest.mark.parametrize("path", ["kernels/kimi_linear/seed.cu", "kernels/w4a16_gemv/seed.cu"])
def test_shipped_seeds_pass(path):
    check_source((ROOT / path).read_text())


def test_harmless_look_alikes_pass():
    check_source(OK + '\n'.join([
        'const char* s = "#include \\"/etc/passwd\\" ?? _Pragma __has_include ##";',
        "// #include \"/etc/passwd\" in a comment, _Pragma too",
        "/* #include <stdio.h>\n   still a comment */",
        "// a comment continued \\\n#include \"/etc/passwd\" (spliced into the comment)",
        "#pragma unroll 4",
        "#pragma nv_diag_suppress 177",
        "#define STR(x) #x",
        "int sep = 1'000'000; float f = 1.5e-3f; char c = '\\'';",
        "int a<:2:> = <%1, 2%>;",
        "#if defined(FOO) && FOO > 1",
        "#elif 0",
        "#endif",
        "#",
    ]) + "\n")


def test_a_comment_spanning_lines_joins_them_as_the_preprocessor_does():
    lines = logical_lines("int a; /* x\n y */ int b;\nint c;\n")
    assert [(ln.number, " ".join(ln.text.split())) for ln in lines[:2]] == [(1, "int a; int b;"), (3, "int c;")]


def test_line_numbers_point_at_the_physical_line():
    with pytest.raises(SourceRuleError, match="^line 4: "):
        check_source("int a;\n/* two\nlines */\n#include <stdio.h>\n")
    lines = logical_lines("#define A \\\n  1\nint b; // c\n")
    assert [(ln.number, ln.text.strip()) for ln in lines[:2]] == [(1, "#define A   1"), (3, "int b;")]


def test_validate_reports_rule_breaks_as_candidate_errors():
    with pytest.raises(CandidateError, match="line 1: #include <stdio.h> is not on the allow-list"):
        validate(Candidate(source="#include <stdio.h>\n"))


HEADER_MACROS = {
    "_CCCL_HAS_INCLUDE": "#include <cuda/std/cstdint>\n#if _CCCL_HAS_INCLUDE(</etc/passwd>)\n#endif\n",
    "_CCCL_PRAGMA": '#include <cuda/std/cstdint>\n_CCCL_PRAGMA(message("x"))\n',
    "_CCCL_PP_CAT pasting _Pragma": '#include <cuda/std/cstdint>\n_CCCL_PP_CAT(_Pra, gma)("message(\\"x\\")")\n',
    "an alias of a pasting macro": "#include <cuda/std/cstdint>\n#define CAT _CCCL_PP_CAT\n",
}


@pytest.mark.parametrize("name", list(HEADER_MACROS))
def test_header_macros_that_stand_for_refused_operators_are_refused(name):
    with pytest.raises(CandidateError, match="CUDA header macro"):
        validate(Candidate(source=HEADER_MACROS[name]))


def test_which_header_macros_are_refused():
    from megakernel_agent.sandbox.header_macros import macros_that_reach_the_preprocessor

    denied = macros_that_reach_the_preprocessor([
        "#define PRAGMA(x) _Pragma(#x)\n#define CAT(a, b) a##b\n#define CAT2(a, b) CAT(a, b)\n"
        "#define ALIAS CAT\n#define FIXED PRAGMA(unroll)\n#define INF __builtin_inff()\n"
        "#define HAS(x) __has_include(x)\n#define LONG(a) \\\n  CAT(a, 1)\n"])
    assert denied == {"PRAGMA", "CAT", "CAT2", "ALIAS", "HAS", "LONG"}   # FIXED and INF cannot be steered


def test_the_shipped_seeds_use_no_refused_header_macro():
    for path in ("kernels/kimi_linear/seed.cu", "kernels/w4a16_gemv/seed.cu"):
        validate(Candidate(source=(ROOT / path).read_text()))
