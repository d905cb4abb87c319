"""A Cluster's settings in three groups (clamor/runtime/options.py): the
same settings by name or in a group, checked in one place, without
processes (a Cluster is not started until it is used)."""
import pytest

import clamor
from clamor import NetworkOptions, RecoveryOptions, WorkerOptions


def settings(cl):
    return (cl.nworkers, cl.remote, cl.start_method, cl.slots, cl.same_host, cl._ports, cl.replication, cl.encrypt,
            cl.recover, cl.replace_workers, cl.max_attempts, cl.speculation, cl.heartbeat_timeout, cl.start_timeout)


def test_a_group_and_its_settings_by_name_make_the_same_cluster():
    by_name = clamor.Cluster(workers=3, slots=5, start_method="spawn", same_host="fetch", worker_ports=(47100, 47109),
                             replication="off", encrypt=False, max_attempts=2, speculation=False,
                             heartbeat_timeout=3, start_timeout=7, progress=False)
    grouped = clamor.Cluster(workers=WorkerOptions(3, slots=5, start_method="spawn", same_host="fetch"),
                             network=NetworkOptions(worker_ports=(47100, 47109), replication="off", encrypt=False),
                             recovery=RecoveryOptions(max_attempts=2, speculation=False, heartbeat_timeout=3,
                                                      start_timeout=7), progress=False)
    assert settings(by_name) == settings(grouped)
    assert settings(by_name)[5] == "47100-47109" and settings(by_name)[12] == 3.0


def test_a_group_fills_in_what_it_is_not_given():
    cl = clamor.Cluster(workers=2, network=NetworkOptions(encrypt=False), slots=4, progress=False)
    assert (cl.nworkers, cl.slots, cl.encrypt, cl.max_attempts) == (2, 4, False, 4)
    assert isinstance(cl.speculation, clamor.Speculation)


def test_a_setting_given_twice_or_unknown_is_refused():
    with pytest.raises(TypeError, match="slots given both"):
        clamor.Cluster(workers=WorkerOptions(2), slots=3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        clamor.Cluster(workers=1, bogus=1)
    with pytest.raises(clamor.ConfigError, match="NetworkOptions"):
        clamor.Cluster(workers=1, network=RecoveryOptions())


@pytest.mark.parametrize("kw, message", [
    ({"workers": WorkerOptions(0)}, "positive int"),
    ({"network": NetworkOptions(worker_ports="47000-47010")}, "tuple of ports"),
    ({"recovery": RecoveryOptions(max_attempts=0)}, "max_attempts"),
    ({"network": NetworkOptions(replication="x")}, "replication"),
])
def test_a_bad_setting_in_a_group_is_a_config_error(kw, message):
    with pytest.raises(clamor.ConfigError, match=message):
        clamor.Cluster(**kw)
