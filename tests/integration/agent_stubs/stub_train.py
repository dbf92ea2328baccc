"""Stub trainer for the host agent's integration tests (stdlib only).

Takes the real trainer's arguments (--config --task --epochs), reads the GPUQ_* environment,
writes a heartbeat and result/metrics.jsonl, and behaves per its JSON config file:
  sleep (s), exit (code), crash (uncaught exception), hang (sleep forever), kill_self (SIGKILL
  itself), ignore_term (SIG_IGN SIGTERM), wait_file (block until that file exists), no_metrics,
  best_pt (a file copied to ckpt/best.pt), dump_env (write the environment to result/env.json),
  runs_file (append start/end records),
  orphan_pid_file (start a sleeper in a new session, as torchrun starts its workers, and write
  its pid there).
"""

import argparse
import json
import os
import signal
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--task", required=True)
    ap.add_argument("--epochs", type=int, required=True)
    a = ap.parse_args()
    with open(a.config) as f:
        cfg = json.load(f)
    env = os.environ
    job = env["GPUQ_JOB_ID"]

    def record(event, **kw):
        if cfg.get("runs_file"):
            line = dict(job=job, event=event, t=time.time(), pid=os.getpid(), **kw)
            with open(cfg["runs_file"], "a") as f:
                f.write(json.dumps(line) + "\n")

    if cfg.get("ignore_term"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if cfg.get("term_exit"):  # a rank whose peer vanished: exits with its own code, not 143
        signal.signal(signal.SIGTERM, lambda *_: os._exit(int(cfg["term_exit"])))
    record("start", task=a.task, epochs=a.epochs, cwd=os.getcwd(), config=a.config)
    result = env["GPUQ_RESULT_DIR"]
    os.makedirs(result, exist_ok=True)
    if cfg.get("dump_env"):
        with open(os.path.join(result, "env.json"), "w") as f:
            json.dump(dict(os.environ), f)

    def heartbeat(step, phase):
        tmp = env["GPUQ_HEARTBEAT"] + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"time": time.time(), "step": step, "total_steps": 0, "epoch": step // 10,
                       "epochs": a.epochs, "loss": 1.0 / (step + 1), "lr": 0.1, "phase": phase,
                       "steps_per_s": 10.0}, f)
        os.replace(tmp, env["GPUQ_HEARTBEAT"])

    heartbeat(0, "train")
    if cfg.get("orphan_pid_file"):
        import subprocess

        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                 start_new_session=True, stdin=subprocess.DEVNULL)
        with open(cfg["orphan_pid_file"], "w") as f:
            f.write(str(child.pid))
    print(f"stub {job} started task={a.task} epochs={a.epochs}", flush=True)
    step = 0
    deadline = time.time() + 60
    while cfg.get("wait_file") and not os.path.exists(cfg["wait_file"]) and time.time() < deadline:
        time.sleep(0.05)
        step += 1
        heartbeat(step, "train")
    end = time.time() + float(cfg.get("sleep", 0))
    while time.time() < end:
        time.sleep(0.05)
        step += 1
        heartbeat(step, "train")
    if cfg.get("kill_self"):
        os.kill(os.getpid(), signal.SIGKILL)
    if cfg.get("crash"):
        raise RuntimeError("stub crash on purpose")
    while cfg.get("hang"):
        time.sleep(0.1)
    if not cfg.get("no_metrics"):
        with open(os.path.join(result, "metrics.jsonl"), "a") as f:
            f.write(json.dumps({"kind": "train", "step": step, "epoch": 0, "loss": 0.5, "lr": 0.1,
                                "time": time.time()}) + "\n")
    if cfg.get("best_pt"):  # a file to leave as ckpt/best.pt (the wrapper's best_ckpt check reads it)
        import shutil
        shutil.copyfile(cfg["best_pt"], os.path.join(env["GPUQ_CKPT_DIR"], "best.pt"))
    heartbeat(step, "done")
    record("end")
    sys.exit(int(cfg.get("exit", 0)))


if __name__ == "__main__":
    main()
