"""The run's lock (streamback.train.runlock): one trainer per run across nodes, also where
`flock` holds on one node only (Lustre's `localflock`): `use_flock=False` is that, as a process
on another node sees it, and "Slurm jobs" are environments with distinct SLURM_JOB_IDs whose
states a `job_state` function passed in gives."""

import fcntl
import json
import os
import socket

import pytest

from streamback import layout
from streamback.errors import StreambackError
from streamback.train import runlock


def as_job(monkeypatch, job):
    if job is None:
        monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    else:
        monkeypatch.setenv("SLURM_JOB_ID", job)
    for name in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_STEP_ID"):
        monkeypatch.delenv(name, raising=False)


def stamp_of(root):
    return json.loads((root / layout.TRAINER_LOCK).read_text())


def states(**by_job):
    return lambda job: by_job.get(job)


def dead_pid():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def test_a_second_job_is_refused_naming_the_job_that_holds_the_run(monkeypatch, tmp_path):
    as_job(monkeypatch, "101")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "100")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    first = runlock.lock_run(tmp_path, use_flock=False)
    assert stamp_of(tmp_path) == {
        "job": "101",
        "array": "100_1",
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "since": stamp_of(tmp_path)["since"],
    }
    as_job(monkeypatch, "202")  # another node's job: its flock would not see the first's
    for state in ("RUNNING", "COMPLETING", "SUSPENDED", runlock.UNKNOWN):
        with pytest.raises(StreambackError) as refused:
            runlock.lock_run(tmp_path, use_flock=False, job_state=states(**{"101": state}))
        message = str(refused.value)
        assert "\n" not in message
        holder = f"Slurm job 101 (array task 100_1) on host {socket.gethostname()}, PID {os.getpid()}"
        assert f"is held by {holder}" in message
        assert "scancel 101" in message
    assert stamp_of(tmp_path)["job"] == "101"  # untouched
    first.check()
    first.close()
    assert not (tmp_path / layout.TRAINER_LOCK).exists()
    runlock.lock_run(tmp_path, use_flock=False, job_state=states()).close()


def test_a_lock_whose_job_ended_is_taken_over_and_its_holder_stops_at_its_next_check(monkeypatch, tmp_path):
    as_job(monkeypatch, "101")
    first = runlock.lock_run(tmp_path, use_flock=False)
    as_job(monkeypatch, "202")
    said = []
    for state in (None, "COMPLETED", "PENDING", "FAILED", "TIMEOUT"):  # a PENDING (requeued) job writes nothing
        second = runlock.lock_run(tmp_path, said.append, use_flock=False, job_state=states(**{"101": state}))
        assert stamp_of(tmp_path)["job"] == "202"
        second.close()
        first = runlock.RunLock(first.path, first.text, None)
        first.path.write_text(first.text)  # the first's stamp again, for the next state
    assert said[0].startswith(f"took over {tmp_path / layout.TRAINER_LOCK}: its holder, Slurm job 101 ")
    assert "(job 101 is no longer known to Slurm)" in said[0] and "(job 101 is COMPLETED)" in said[1]
    second = runlock.lock_run(tmp_path, use_flock=False, job_state=states())
    with pytest.raises(StreambackError, match=r"no longer holds this trainer's stamp \(it is Slurm job 202 "):
        first.check()
    first.close()  # not its file any more: left alone
    assert stamp_of(tmp_path)["job"] == "202"
    second.close()


def test_an_earlier_attempt_of_the_same_job_is_stale_unless_its_pid_lives(monkeypatch, tmp_path):
    as_job(monkeypatch, "101")  # a requeued job runs again under its id
    lock = tmp_path / layout.TRAINER_LOCK
    never = states()  # Slurm is not asked about this job itself
    lock.write_text(json.dumps({"job": "101", "host": socket.gethostname(), "pid": dead_pid(), "since": "then"}))
    runlock.lock_run(tmp_path, use_flock=False, job_state=never).close()
    helper = os.fork()
    if helper == 0:
        import time

        time.sleep(60)
        os._exit(0)
    try:
        lock.write_text(json.dumps({"job": "101", "host": socket.gethostname(), "pid": helper, "since": "now"}))
        with pytest.raises(StreambackError, match=rf"held by Slurm job 101 on host .*, PID {helper}.*PID lives"):
            runlock.lock_run(tmp_path, use_flock=False, job_state=never)
    finally:
        os.kill(helper, 9)
        os.waitpid(helper, 0)


def test_without_slurm_a_pid_on_this_host_is_judged_and_one_on_another_host_is_kept(monkeypatch, tmp_path):
    as_job(monkeypatch, None)
    lock = tmp_path / layout.TRAINER_LOCK
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": dead_pid(), "since": "then"}))
    runlock.lock_run(tmp_path).close()
    lock.write_text(json.dumps({"host": "gpu-07", "pid": 4242, "since": "then"}))
    with pytest.raises(StreambackError, match=r"held by PID 4242 on host gpu-07 \(since then\) \(it is on another"):
        runlock.lock_run(tmp_path)


def test_an_older_flock_only_lock_file_is_kept_while_its_flock_is_held(monkeypatch, tmp_path):
    as_job(monkeypatch, None)
    lock = tmp_path / layout.TRAINER_LOCK
    lock.write_text("PID 4242 on host gpu-07 (since 2026-12-01 10:00:00 UTC)\n")
    with open(lock) as older:  # a trainer of the flock-only kind, alive
        fcntl.flock(older, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(StreambackError, match=r"held by a trainer of an older streamback .*\(its flock is held\)"):
            runlock.lock_run(tmp_path)
    runlock.lock_run(tmp_path).close()  # its flock gone: stale


def test_of_many_processes_that_find_one_stale_lock_exactly_one_takes_it(tmp_path):
    (tmp_path / layout.TRAINER_LOCK).write_text(json.dumps({"job": "1", "host": "gone", "pid": 1, "since": "then"}))
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    children = []
    for k in range(6):
        pid = os.fork()
        if pid == 0:
            os.environ["SLURM_JOB_ID"] = str(1000 + k)
            os.write(ready_w, b"r")
            os.read(go_r, 1)
            try:
                runlock.lock_run(
                    tmp_path, lambda line: None, use_flock=False, job_state=lambda j: "RUNNING" if j != "1" else None
                )
            except StreambackError:
                os._exit(1)
            os._exit(0)  # the lock stays: its file outlives this process
        children.append(pid)
    for _ in children:
        os.read(ready_r, 1)
    os.write(go_w, b"g" * len(children))
    won = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0 for pid in children]
    assert sum(won) == 1, won
    assert stamp_of(tmp_path)["job"] == str(1000 + won.index(True))
    assert sorted(p.name for p in tmp_path.iterdir()) == [layout.TRAINER_LOCK]  # no takeover or temporary file left


def test_a_resubmitted_job_waits_for_the_live_job_that_holds_the_run(monkeypatch, tmp_path):
    as_job(monkeypatch, "101")
    runlock.lock_run(tmp_path, use_flock=False)
    as_job(monkeypatch, "202")
    answers = iter(["RUNNING", "RUNNING", "COMPLETING", None])
    said = []
    assert runlock.wait_for_holder(tmp_path, said.append, poll_s=0, job_state=lambda job: next(answers))
    assert next(answers, "asked until it ended") == "asked until it ended"
    (line,) = said
    assert line.startswith("this run is held by Slurm job 101 on host ") and "scancel 101 to stop it now" in line
    stop = iter([False, True])
    running = states(**{"101": "RUNNING"})
    assert not runlock.wait_for_holder(tmp_path, poll_s=0, stopped=lambda: next(stop), job_state=running)
    as_job(monkeypatch, None)  # a holder outside Slurm, or none: nothing to wait for (the trainer judges it)
    (tmp_path / layout.TRAINER_LOCK).write_text(json.dumps({"host": "gpu-07", "pid": 1, "since": "then"}))
    assert runlock.wait_for_holder(tmp_path, job_state=states())
    (tmp_path / layout.TRAINER_LOCK).unlink()
    assert runlock.wait_for_holder(tmp_path, job_state=states())
