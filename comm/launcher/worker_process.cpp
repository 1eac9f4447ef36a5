#include "comm/launcher/worker_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <utility>

#include "comm/error.h"

namespace hsgd::comm::launcher {
namespace {

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Fills a pipe pair with O_CLOEXEC so no other child inherits it by accident.
void make_pipe(int fds[2], const char* what) {
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    HSGD_THROW(Error, "WorkerProcess: pipe2 for ", what, " failed: ", std::strerror(errno));
  }
}

// A directory passes access(X_OK) too, but cannot be executed.
bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// Runs in the child between fork and exec: only async-signal-safe calls from here on.
[[noreturn]] void exec_child(const char* path, char* const argv[], char* const envp[], pid_t parent,
                             int out_w, int err_w, int exec_err_w) {
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // The parent may have died before prctl took effect: then nobody would ever kill us.
  if (::getppid() != parent) ::_exit(127);
  // The launcher blocks SIGINT/SIGTERM/SIGUSR1 to handle them in one thread, and may ignore
  // SIGPIPE; both the mask and ignored dispositions survive exec, so give the worker a clean slate.
  sigset_t none;
  ::sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  for (int sig : {SIGINT, SIGTERM, SIGUSR1, SIGPIPE, SIGHUP, SIGQUIT}) ::signal(sig, SIG_DFL);
  if (::dup2(out_w, STDOUT_FILENO) < 0 || ::dup2(err_w, STDERR_FILENO) < 0) {
    int err = errno;
    (void)!::write(exec_err_w, &err, sizeof(err));
    ::_exit(127);
  }
  // Like subprocess.Popen(close_fds=True): sockets of the launcher (the store connection, an
  // embedded server) must not leak into workers. Best effort: old kernels lack the flag.
  ::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
  ::execve(path, argv, envp);
  int err = errno;
  (void)!::write(exec_err_w, &err, sizeof(err));
  ::_exit(127);
}

}  // namespace

std::string ExitStatus::describe() const {
  std::ostringstream out;
  if (signal != 0) {
    const char* name = ::sigabbrev_np(signal);
    out << "signal " << signal << " (SIG" << (name != nullptr ? name : "?") << ")";
  } else {
    out << "exit code " << exit_code;
  }
  return out.str();
}

std::string resolve_program(const std::string& program, const std::string& path_env) {
  HSGD_CHECK(!program.empty(), "resolve_program: the program name is empty");
  if (program.find('/') != std::string::npos) {
    if (!is_executable_file(program)) {
      HSGD_THROW(InvalidArgument, "program '", program,
                 "' does not exist or is not an executable file");
    }
    return program;
  }
  std::istringstream dirs(path_env);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + program;
    if (is_executable_file(candidate)) return candidate;
  }
  HSGD_THROW(InvalidArgument, "program '", program, "' not found on PATH '", path_env, "'");
}

WorkerProcess WorkerProcess::spawn(const std::vector<std::string>& argv,
                                   const std::vector<std::string>& env) {
  HSGD_CHECK(!argv.empty(), "WorkerProcess::spawn: empty argv");
  std::string path_env = "/usr/local/bin:/usr/bin:/bin";
  for (const auto& entry : env) {
    if (entry.rfind("PATH=", 0) == 0) path_env = entry.substr(5);
  }
  const std::string path = resolve_program(argv[0], path_env);

  // Everything the child needs is prepared before fork: it may not allocate afterwards.
  std::vector<char*> c_argv;
  for (const auto& a : argv) c_argv.push_back(const_cast<char*>(a.c_str()));
  c_argv.push_back(nullptr);
  std::vector<char*> c_env;
  for (const auto& e : env) c_env.push_back(const_cast<char*>(e.c_str()));
  c_env.push_back(nullptr);

  int out[2], err[2], exec_err[2];
  make_pipe(out, "stdout");
  make_pipe(err, "stderr");
  make_pipe(exec_err, "exec status");
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    int e = errno;
    for (int fd : {out[0], out[1], err[0], err[1], exec_err[0], exec_err[1]}) ::close(fd);
    HSGD_THROW(Error, "WorkerProcess: fork failed: ", std::strerror(e));
  }
  if (pid == 0)
    exec_child(path.c_str(), c_argv.data(), c_env.data(), parent, out[1], err[1], exec_err[1]);

  // Also set the group from the parent, so signal_group() works even before the child ran.
  ::setpgid(pid, pid);
  ::close(out[1]);
  ::close(err[1]);
  ::close(exec_err[1]);
  WorkerProcess w;
  w.pid_ = pid;
  w.reaped_ = false;
  w.stdout_fd_ = out[0];
  w.stderr_fd_ = err[0];

  // The exec-status pipe closes on a successful exec (CLOEXEC) or carries errno on failure.
  int exec_errno = 0;
  ssize_t n;
  do {
    n = ::read(exec_err[0], &exec_errno, sizeof(exec_errno));
  } while (n < 0 && errno == EINTR);
  ::close(exec_err[0]);
  if (n == static_cast<ssize_t>(sizeof(exec_errno))) {
    w.kill_and_reap();
    HSGD_THROW(InvalidArgument, "cannot execute '", path, "': ", std::strerror(exec_errno));
  }
  return w;
}

WorkerProcess::WorkerProcess(WorkerProcess&& other) noexcept { *this = std::move(other); }

WorkerProcess& WorkerProcess::operator=(WorkerProcess&& other) noexcept {
  if (this != &other) {
    kill_and_reap();
    close_fd(stdout_fd_);
    close_fd(stderr_fd_);
    pid_ = std::exchange(other.pid_, -1);
    reaped_ = std::exchange(other.reaped_, true);
    stdout_fd_ = std::exchange(other.stdout_fd_, -1);
    stderr_fd_ = std::exchange(other.stderr_fd_, -1);
    status_ = std::exchange(other.status_, std::nullopt);
  }
  return *this;
}

WorkerProcess::~WorkerProcess() {
  kill_and_reap();
  close_fd(stdout_fd_);
  close_fd(stderr_fd_);
}

int WorkerProcess::take_stdout_fd() { return std::exchange(stdout_fd_, -1); }
int WorkerProcess::take_stderr_fd() { return std::exchange(stderr_fd_, -1); }

const std::optional<ExitStatus>& WorkerProcess::poll() {
  if (status_ || reaped_) return status_;
  siginfo_t info{};
  // WNOWAIT: observe the exit but leave the zombie, which keeps the group id reserved.
  if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
      info.si_pid == pid_) {
    ExitStatus s;
    if (info.si_code == CLD_EXITED) {
      s.exit_code = info.si_status;
    } else {
      s.signal = info.si_status;
    }
    status_ = s;
  }
  return status_;
}

void WorkerProcess::signal_group(int sig) {
  if (reaped_ || pid_ <= 0) return;
  // The group may be gone already (ESRCH) when only the zombie leader is left; that is fine.
  ::kill(-pid_, sig);
}

void WorkerProcess::kill_and_reap() {
  if (reaped_ || pid_ <= 0) return;
  ::kill(-pid_, SIGKILL);
  ::kill(pid_, SIGKILL);  // in case the child had not yet entered its own group
  int wstatus = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &wstatus, 0);
  } while (r < 0 && errno == EINTR);
  if (!status_ && r == pid_) {
    ExitStatus s;
    if (WIFEXITED(wstatus)) {
      s.exit_code = WEXITSTATUS(wstatus);
    } else if (WIFSIGNALED(wstatus)) {
      s.signal = WTERMSIG(wstatus);
    }
    status_ = s;
  }
  reaped_ = true;
}

}  // namespace hsgd::comm::launcher
