import signal, time, pytest
from django.db import transaction
from django_jobs import workflow, cancel_workflow
from django_jobs.models import Job, DeadLetter, CompletionMarker, WorkerBeat, Dependency, WorkflowStep
from tests.conftest import wait_for
from tests.testapp.models import Audit
STEP = "tests.bb.step"

@pytest.mark.parametrize("run", range(30))
@pytest.mark.django_db(transaction=True)
def test_cancel_mid(worker_process, run):
    layers, width = 8, 40
    with transaction.atomic(), workflow(name="mid-run") as w:
        previous = []
        for layer in range(layers):
            previous = [w.enqueue(STEP, {"label": f"s{layer}-{i}", "ms": 2}, after=previous[i:i+2]) for i in range(width)]
    workers = [worker_process("--concurrency", "4", "--heartbeat", "0.3") for _ in range(2)]
    wait_for(lambda: WorkerBeat.objects.count() >= 2)
    wait_for(lambda: CompletionMarker.objects.count() >= width)
    try:
        result = cancel_workflow("mid-run", by="tester")
    except Exception as e:
        print("CANCEL RAISED", type(e).__name__, e)
        result = None
    print("result", result)
    deadline = time.monotonic() + 15
    while Job.objects.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    left = list(Job.objects.values("id", "waiting_for", "run_at", "locked_by", "lease_expires_at", "attempts", "cancel_requested_at", "dependents"))
    if left:
        print("LEFT", left)
        for j in left:
            print(" edges", list(Dependency.objects.filter(job_id=j["id"]).values("parent_id", "parent_key", "satisfied_at")))
            for e in Dependency.objects.filter(job_id=j["id"]):
                print("   parent", e.parent_id, "marker", CompletionMarker.objects.filter(job_id=e.parent_id).exists(), "letter", list(DeadLetter.objects.filter(id=e.parent_id).values_list("reason", "dead_at")), "live", Job.objects.filter(id=e.parent_id).exists())
        print("cancel letters", DeadLetter.objects.count(), "markers", CompletionMarker.objects.count())
    for p in workers: p.signal(signal.SIGTERM)
    for p in workers: p.wait()
    if left:
        print(workers[0].output()[-3000:])
    assert not left
