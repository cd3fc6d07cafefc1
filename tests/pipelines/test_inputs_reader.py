"""Readers that ask SIG first: hit/miss accounting, two jobs with overlapping graphs sharing
the materialized parts, and the same through the HTTP service (localhost, keys only,
corrupt files refused)."""

import json
import urllib.error
import urllib.request

import pytest

from pipelines.inputs.graph import ctr_graph, partition_key
from pipelines.inputs.raw import SyntheticRawLog
from pipelines.inputs.reader import NoSig, SigReader, StoreClient
from pipelines.inputs.service import HttpClient, SigService
from pipelines.inputs.store import PartStore

JOB_A = dict(num_sparse=10, rows=1000, window=64)
# Job B: two features with other table sizes (computed by readers from stored columns) and
# a longer window for the user's activity (a stored node A lacks).
JOB_B = dict(num_sparse=10, rows=1000, window=128, bucket_rows={0: 300, 3: 5000})


@pytest.fixture
def raw(tmp_path):
    return SyntheticRawLog(str(tmp_path / "raw"), rows=700, seed=4, users=80)


def materialized(graph):
    return [n for n in graph.needed() if graph.by_name[n].materialized]


def test_hits_and_misses_are_counted_per_node_and_partition(tmp_path, raw):
    graph = ctr_graph(**JOB_A)
    stored = len(materialized(graph))
    store = PartStore(str(tmp_path / "store"))
    first = SigReader(graph, raw, StoreClient(store))
    tables = [first.read(p) for p in (0, 1)]
    s = first.stats
    assert (s.partitions, s.lookups, s.hits, s.misses, s.raw_parses, s.published) == (2, 2 * stored, 0, 2 * stored, 2,
                                                                                     2 * stored)  # fmt: skip
    assert s.cpu_s > 0 and s.wall_s > 0
    second = SigReader(graph, raw, StoreClient(store))
    assert [second.read(p).equals(t) for p, t in zip((0, 1), tables)] == [True, True]
    s = second.stats
    assert (s.lookups, s.hits, s.misses, s.raw_parses, s.published, s.hit_rate) == (2 * stored, 2 * stored, 0, 0, 0, 1.0)
    assert tables[0].equals(SigReader(graph, raw, NoSig()).read(0))
    assert second.read(2).num_rows == raw.rows and second.stats.misses == stored  # a new partition misses


def test_overlapping_jobs_share_the_materialized_parts(tmp_path, raw):
    a, b = ctr_graph(**JOB_A), ctr_graph(**JOB_B)
    assert b.shared_fraction(a) >= 0.7
    new_in_b = [n for n in materialized(b) if b.key(n) not in {a.key(m) for m in materialized(a)}]
    assert new_in_b == ["user_events_128"]
    store = PartStore(str(tmp_path / "store"))
    job_a = SigReader(a, raw, StoreClient(store))
    for p in range(3):
        job_a.read(p)
    job_b = SigReader(b, raw, StoreClient(store))
    for p in range(3):
        assert job_b.read(p).equals(SigReader(b, raw, NoSig()).read(p))
    s = job_b.stats
    assert s.misses == 3 * len(new_in_b) and s.hits == 3 * (len(materialized(b)) - 1)
    assert s.raw_parses == 0  # its one new node is computed from stored columns
    assert s.hit_rate > 0.95
    again_a = SigReader(a, raw, StoreClient(store))
    again_a.read(1)
    assert again_a.stats.hit_rate == 1.0  # B's publish did not disturb A's parts
    # The store holds A's file and B's (its new node only) per partition.
    files = store.commits(partition_key(raw.fingerprint(1)))
    assert len(files) == 2 and [len(f["nodes"]) for f in files] == [len(materialized(a)), 1]


@pytest.fixture
def service(tmp_path, raw):
    service = SigService(PartStore(str(tmp_path / "served")), {"clicks": raw}).start()
    yield service
    service.close()


def _post(url, body):
    request = urllib.request.Request(url, data=body, method="POST")
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())


def test_service_materializes_once_and_serves_readers(service, raw):
    assert service.server.server_address[0] == "127.0.0.1"
    graph = ctr_graph(**JOB_A)
    client = HttpClient(service.url)
    done = client.materialize("clicks", graph, 0, 2)
    assert done["partitions"] == 2 and done["misses"] == 2 * len(materialized(graph))
    assert client.materialize("clicks", graph, 0, 2)["partitions_present"] == 2  # computed once
    reader = SigReader(graph, raw, client)
    assert reader.read(1).equals(SigReader(graph, raw, NoSig()).read(1))
    assert reader.stats.hit_rate == 1.0 and reader.stats.raw_parses == 0
    reader.read(2)  # a miss: computed by the reader, published through the service
    assert len(client.manifest()) == 3


def test_service_requests_name_keys_and_sources_only(service):
    bad = [
        ("/v1/lookup", {"partition": "../../etc/passwd", "nodes": []}, 400, "is not a key"),
        ("/v1/fetch", {"partition": "a" * 64, "file": "../x", "nodes": []}, 400, "is not a key"),
        ("/v1/materialize", {"source": "/etc", "graph": {}, "partitions": [0, 1]}, 404, "source '/etc'"),
        ("/v1/nowhere", {}, 404, "no POST"),
    ]
    for path, body, status, message in bad:
        with pytest.raises(urllib.error.HTTPError) as error:
            _post(service.url + path, json.dumps(body).encode())
        assert error.value.code == status and message in error.value.read().decode()
    with pytest.raises(urllib.error.HTTPError) as error:
        _post(service.url + "/v1/publish?partition=" + "a" * 64, b"\x00not arrow")
    assert error.value.code == 400 and "Arrow IPC" in error.value.read().decode()


def test_service_refuses_to_serve_a_corrupt_part(service, raw):
    graph = ctr_graph(**JOB_A)
    client = HttpClient(service.url)
    client.materialize("clicks", graph, 0, 1)
    (record,) = service.store.manifest()
    client.discard(record["partition"], record["file"])  # a good file: kept
    assert len(service.store.manifest()) == 1
    path = f"{service.store.root}/parts/{record['partition']}/{record['file']}.parquet"
    content = open(path, "rb").read()
    open(path, "wb").write(content[:-10])
    reader = SigReader(graph, raw, client)
    assert reader.read(0).equals(SigReader(graph, raw, NoSig()).read(0))
    assert reader.stats.corrupt == 1 and reader.stats.misses == reader.stats.lookups
    (fresh,) = service.store.manifest()  # the corrupt file is gone, the reader's recomputed one is whole
    assert service.store.read(fresh["partition"], fresh["file"], fresh["nodes"]).num_rows == raw.rows
