"""Languages other than Python: hello world, stdin, compile errors, limits, IOTests, toolchains.

Every toolchain is installed on the machines this runs on (CI too): a missing one fails these
tests loudly (``require_language``) instead of skipping them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_helpers import FAST

from sandbox import (
    ALL_LAYERS,
    CallTest,
    IOTest,
    Job,
    Language,
    LanguageUnavailableError,
    Limits,
    Sandbox,
    Status,
    TestJob,
    TestStatus,
    available_languages,
    languages,
    require_language,
)

OTHER = ["cpp", "java", "nodejs", "rust", "bash"]
COMPILED = ["cpp", "java", "rust"]

#: Reads one line and prints "hi <line>".
ECHO = {
    "cpp": "#include <iostream>\n#include <string>\nint main(){std::string s; std::getline("
    'std::cin, s); std::cout << "hi " << s << "\\n";}\n',
    "java": "import java.util.*;\npublic class Main { public static void main(String[] a) {\n"
    '  Scanner in = new Scanner(System.in); System.out.println("hi " + in.nextLine()); } }\n',
    "nodejs": 'const s = require("fs").readFileSync(0, "utf8").split("\\n")[0];\n'
    'console.log("hi " + s);\n',
    "rust": "use std::io::BufRead;\nfn main() { let mut s = String::new();\n"
    '  std::io::stdin().lock().read_line(&mut s).unwrap(); println!("hi {}", s.trim_end()); }\n',
    "bash": 'read -r line\necho "hi $line"\n',
}
#: Exits with status 3 after writing to stderr.
EXIT3 = {
    "cpp": '#include <cstdio>\nint main(){ fprintf(stderr, "bad\\n"); return 3; }\n',
    "java": 'public class Main { public static void main(String[] a) { System.err.println("bad");'
    " System.exit(3); } }\n",
    "nodejs": 'console.error("bad"); process.exit(3);\n',
    "rust": 'fn main() { eprintln!("bad"); std::process::exit(3); }\n',
    "bash": "echo bad >&2\nexit 3\n",
}
LOOP = {
    "cpp": "int main(){ volatile long x = 0; for(;;) x++; }\n",
    "java": "public class Main { public static void main(String[] a) { long x = 0; "
    "while (true) x++; } }\n",
    "nodejs": "let x = 0; for (;;) x++;\n",
    "rust": "fn main() { let mut x: u64 = 0; loop { x = std::hint::black_box(x + 1); } }\n",
    "bash": "while true; do :; done\n",
}
#: Asks for 4 GiB (or grows without end): over every memory limit used here.
MEMORY = {
    "cpp": "#include <vector>\n#include <cstdio>\nint main(){ std::vector<char> v(4ull << 30);"
    ' v[7] = 1; printf("%d\\n", v[7]); }\n',
    "java": "public class Main { public static void main(String[] a) {"
    " long[] x = new long[1 << 29]; x[5] = 1; System.out.println(x[5]); } }\n",
    "nodejs": "const a = []; while (true) a.push(new Array(1e6).fill(1.5));\n",
    "rust": 'fn main() { let v = vec![1u8; 4 << 30]; println!("{}", v[9]); }\n',
    "bash": 'x=$(printf "%*s" 2000000000 ""); echo ${#x}\n',
}
BROKEN = {
    "cpp": "int main() { return undefined_name; }\n",
    "java": 'public class Main { public static void main(String[] a) { int x = "s"; } }\n',
    "rust": 'fn main() { let x: i32 = "s"; }\n',
}
#: What each compiler says about ``BROKEN``.
COMPILER_SAYS = {"cpp": "undefined_name", "java": "incompatible types", "rust": "E0308"}


@pytest.fixture(scope="module")
def sb() -> Iterator[Sandbox]:
    with Sandbox(limits=FAST, workers=2) as box:
        yield box


def test_every_language_is_installed_here() -> None:
    # CI machines have every toolchain; a missing one must fail here, not skip elsewhere.
    assert set(available_languages()) == set(Language)
    assert [lang.value for lang in Language] == ["python", *OTHER]


@pytest.mark.parametrize("language", OTHER)
def test_hello_and_stdin(sb: Sandbox, language: str) -> None:
    res = sb.run(ECHO[language], stdin="abc\n", language=language)
    assert res.status is Status.OK, res
    assert res.stdout == "hi abc\n"
    assert (res.compile is not None) == (language in COMPILED)
    if res.compile is not None:
        assert res.compile.status is Status.OK
        assert res.compile.wall_s > 0
    assert set(res.isolation) == set(sb.isolation)


@pytest.mark.parametrize("language", COMPILED)
def test_compile_error_carries_the_compilers_message(sb: Sandbox, language: str) -> None:
    res = sb.run(BROKEN[language], language=language)
    assert res.status is Status.COMPILE_ERROR
    assert res.compile is not None and res.compile.status is Status.COMPILE_ERROR
    assert COMPILER_SAYS[language] in res.stderr
    assert COMPILER_SAYS[language] in res.detail
    assert res.stdout == ""


@pytest.mark.parametrize("language", OTHER)
def test_runtime_error(sb: Sandbox, language: str) -> None:
    res = sb.run(EXIT3[language], language=language)
    assert res.status is Status.RUNTIME_ERROR, res
    assert res.exit_code == 3
    assert "bad" in res.stderr


@pytest.mark.parametrize("language", OTHER)
def test_infinite_loop_times_out(sb: Sandbox, language: str) -> None:
    res = sb.run(LOOP[language], language=language, limits=Limits(timeout_s=1.0))
    assert res.status is Status.TIMEOUT, res


@pytest.mark.parametrize("language", OTHER)
def test_four_gib_is_a_memory_error(sb: Sandbox, language: str) -> None:
    res = sb.run(MEMORY[language], language=language, limits=Limits(timeout_s=10, memory_mb=512))
    assert res.status is Status.MEMORY, res


def test_compile_bomb_hits_the_compile_time_limit(sb: Sandbox) -> None:
    bomb = (
        "template<int A, int B> struct P {\n"
        "  static constexpr long v = P<A-1,B>::v + P<A,B-1>::v; };\n"
        "template<int B> struct P<0,B> { static constexpr long v = 1; };\n"
        "template<int A> struct P<A,0> { static constexpr long v = 1; };\n"
        "int main() { return P<400,400>::v & 1; }\n"
    )
    res = sb.run(bomb, language="cpp", compile_timeout_s=1.0)
    assert res.status is Status.COMPILE_ERROR
    assert res.compile is not None and res.compile.status is Status.TIMEOUT
    assert res.compile.wall_s < 10


def test_compiler_cannot_include_host_secrets(sb: Sandbox) -> None:
    res = sb.run('#include "/etc/shadow"\nint main() {}\n', language="cpp")
    assert res.status is Status.COMPILE_ERROR
    assert "/etc/shadow" in res.stderr  # the compiler says it could not read it ...
    assert "root:" not in res.stderr  # ... and shows none of it


def test_io_tests_compile_once_and_run_each_test_fresh(sb: Sandbox) -> None:
    # A file left by one test's run would be seen by the next: each run prints "fresh" only if
    # its work dir has no such file.
    program = (
        "#include <cstdio>\n#include <iostream>\nint main() { long a, b; std::cin >> a >> b;\n"
        '  FILE* f = fopen("seen", "r"); if (f) { puts("stale"); return 0; }\n'
        '  f = fopen("seen", "w"); fputs("x", f); fclose(f);\n'
        '  printf("fresh %ld\\n", a + b); }\n'
    )
    tests = (IOTest("1 2\n", "fresh 3\n"), IOTest("5 5\n", "fresh 10\n"), IOTest("0 0", "fresh 1"))
    report = sb.run_tests(program, tests, language="cpp")
    assert [r.status for r in report.results] == [
        TestStatus.PASSED, TestStatus.PASSED, TestStatus.FAILED,
    ]  # fmt: skip
    assert report.compile is not None and report.compile.status is Status.OK
    assert report.status is Status.OK


@pytest.mark.parametrize("language", OTHER)
def test_io_tests_per_language(sb: Sandbox, language: str) -> None:
    job = TestJob(
        ECHO[language], (IOTest("x\n", "hi x\n"), IOTest("y\n", "hi z\n")), language=language
    )
    (report,) = sb.run_tests_many([job])
    assert [r.status for r in report.results] == [TestStatus.PASSED, TestStatus.FAILED]


def test_compile_error_fails_every_test(sb: Sandbox) -> None:
    report = sb.run_tests(BROKEN["cpp"], [IOTest("", "1"), IOTest("", "2")], language="cpp")
    assert report.status is Status.COMPILE_ERROR
    assert [r.status for r in report.results] == [TestStatus.COMPILE_ERROR] * 2
    assert all("undefined_name" in r.detail for r in report.results)
    assert not report.all_passed


def test_run_many_mixes_languages(sb: Sandbox) -> None:
    jobs = [Job(ECHO[lang], stdin=f"{lang}\n", language=lang) for lang in OTHER]
    results = sb.run_many([*jobs, "print('hi python')"])
    assert [r.stdout for r in results] == [f"hi {lang}\n" for lang in [*OTHER, "python"]]


def test_bad_arguments_raise_at_once(sb: Sandbox) -> None:
    with pytest.raises(ValueError, match="valid languages are python, cpp, java"):
        sb.run("x", language="c++")
    with pytest.raises(ValueError, match="IOTests only"):
        sb.run_tests("int f();", [CallTest("assert candidate() == 1")], entry_point="f",
                     language="cpp")  # fmt: skip
    with pytest.raises(ValueError, match="compile_timeout_s"):
        sb.run("int main(){}", language="cpp", compile_timeout_s=0)
    with pytest.raises(ValueError, match="reserved"):
        sb.run("int main(){}", language="cpp", files={"main.cpp": "x"})
    with pytest.raises(ValueError, match="unknown language"):
        sb.run_many([Job("print(1)"), Job("x", language="cobol")])  # before any job runs
    # 60 MiB of stdin fits a Python run, not one that also carries a compiled program.
    with pytest.raises(ValueError, match="over the limit"):
        sb.run("int main(){}", stdin="x" * (60 << 20), language="cpp")


def test_missing_toolchain_is_a_clear_error(
    sb: Sandbox, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no program is found
    monkeypatch.setattr(languages, "EXTRA_SEARCH_DIRS", ())
    with pytest.raises(LanguageUnavailableError, match=r"`g\+\+` not found.*apt-get install g\+\+"):
        require_language("cpp")
    with pytest.raises(LanguageUnavailableError, match=r"`javac` not found.*JDK 17"):
        require_language("java")
    with pytest.raises(LanguageUnavailableError, match=r"`rustc` not found.*rustup"):
        sb.run("fn main() {}", language="rust")
    assert available_languages() == (Language.PYTHON,)
    assert isinstance(LanguageUnavailableError("x"), ValueError)


def test_rust_toolchain_is_exposed_read_only_and_nothing_else_of_root(sb: Sandbox) -> None:
    sysroot = require_language("rust").expose_dirs[0]
    code = f"""
import os
for path in ("/root", "/root/.cargo", "{sysroot}"):
    try:
        print(path, "listing", sorted(os.listdir(path)))
    except OSError as e:
        print(path, "denied", type(e).__name__)
try:
    open("{sysroot}/lib/x", "w")
    print("wrote")
except OSError as e:
    print("write refused", type(e).__name__)
"""
    res = sb.run(code)
    assert res.status is Status.OK, res
    root, cargo, toolchain, write = res.stdout.splitlines()
    assert root in ("/root denied PermissionError", "/root listing []"), root
    assert cargo.startswith("/root/.cargo denied"), cargo
    assert "'bin'" in toolchain and "'lib'" in toolchain, toolchain  # rustc's own folders
    assert write.startswith("write refused"), write


def test_strict_sandbox_applies_every_layer_to_every_language() -> None:
    with Sandbox(limits=FAST, workers=1, strict=True) as strict:
        assert set(strict.isolation) == set(ALL_LAYERS)
        for language in OTHER:
            res = strict.run(ECHO[language], stdin="s\n", language=language)
            assert res.status is Status.OK, res
            assert set(res.isolation) == set(ALL_LAYERS)


STDCXX = (
    "#include <bits/stdc++.h>\nint main() { std::vector<int> v{3, 1, 2};\n"
    '  std::sort(v.begin(), v.end()); std::cout << v[0] << "\\n"; }\n'
)


def test_cpp_compiles_against_a_precompiled_bits_stdcxx(sb: Sandbox) -> None:
    toolchain = require_language("cpp")
    assert toolchain.pch_dir is not None
    assert ("-I", toolchain.pch_dir) == toolchain.compile_argv[4:6]
    res = sb.run(STDCXX, language="cpp")
    assert res.status is Status.OK and res.stdout == "1\n", res
    header = Path(toolchain.pch_dir) / "bits" / "stdc++.h.gch"
    assert header.stat().st_size > 1 << 20  # built (once per machine) before that compile
    assert header.stat().st_mode & 0o777 == 0o644  # runs read it; nobody but its owner writes
    # Runs see it read-only; the compiler uses it (g++ -H marks a valid precompiled header !).
    probe = f"""
import subprocess
open("m.cpp", "w").write("#include <bits/stdc++.h>\\nint main() {{}}\\n")
r = subprocess.run(["g++", "-std=gnu++17", "-O2", "-I", "{toolchain.pch_dir}", "-H", "-o", "m",
                    "m.cpp"], capture_output=True, text=True)
print(r.stderr.splitlines()[0])
try:
    open("{header}", "a")
except OSError as e:
    print("write refused", type(e).__name__)
"""
    out = sb.run(probe, limits=Limits(timeout_s=20, memory_mb=2048)).stdout.splitlines()
    assert out[0] == f"! {header}", out
    assert out[1].startswith("write refused"), out


def test_a_bad_precompiled_header_never_breaks_a_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    # Under a hidden folder (home), as the default cache is: exposed read-only to runs.
    cache = Path.home() / f".cache/grpo-sandbox-test-{os.getpid()}"
    monkeypatch.setenv("GRPO_SANDBOX_CACHE", str(cache))
    try:
        folder = require_language("cpp").pch_dir
        assert folder is not None and folder.startswith(str(cache))
        (Path(folder) / "bits").mkdir(parents=True)
        (Path(folder) / "bits" / "stdc++.h.gch").write_bytes(b"not a precompiled header")
        with Sandbox(limits=FAST, workers=1) as box:
            res = box.run(STDCXX, language="cpp")
        assert res.status is Status.OK and res.stdout == "1\n", res  # g++ used the header
    finally:
        shutil.rmtree(cache, ignore_errors=True)
