"""netbench.yamlfile: the one loader for every YAML file netbench reads (profiles,
playbooks, inventories) takes only what a hand-written file needs."""

from __future__ import annotations

import os
import threading

import pytest

from netbench.errors import shown, shown_key
from netbench.remote.inventory import InventoryError, load_inventory
from netbench.model.playbook import PlaybookError, load_playbook
from netbench.model.profile import ProfileError, load_profile

LOADERS = [(load_profile, ProfileError), (load_playbook, PlaybookError), (load_inventory, InventoryError)]
LOADER_IDS = ["profile", "playbook", "inventory"]


def refused(load, error, path) -> str:
    with pytest.raises(error) as info:
        load(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "\n" not in message, message[:300]
    assert len(message) < 300, message[:300]
    return message


@pytest.mark.parametrize("load, error", LOADERS, ids=LOADER_IDS)
def test_a_key_written_twice_is_refused_with_its_line(tmp_path, load, error):
    path = tmp_path / "f.yaml"
    path.write_text("name: a\ndescription: x\nname: b\n")
    message = refused(load, error, path)
    assert "line 3" in message and "'name' appears twice (first at line 1)" in message


def test_a_nested_key_written_twice_is_refused(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("factors:\n  latency: [1ms]\n  latency: [2ms]\n")
    assert "line 3" in refused(load_playbook, PlaybookError, path)


@pytest.mark.parametrize("load, error", LOADERS, ids=LOADER_IDS)
def test_an_alias_bomb_is_refused_before_it_expands(tmp_path, load, error):
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        lines.append(f"{chr(97 + i)}: &{chr(97 + i)} [{', '.join(['*' + chr(96 + i)] * 10)}]")
    lines.append("name: *i")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    message = refused(load, error, path)
    assert "line 2" in message and "aliases" in message


@pytest.mark.parametrize("load, error", LOADERS, ids=LOADER_IDS)
def test_deep_nesting_is_refused_not_a_recursion_error(tmp_path, load, error):
    path = tmp_path / "deep.yaml"
    path.write_text("name: " + "[" * 5000 + "]" * 5000 + "\n")
    assert "nested more than 32 levels" in refused(load, error, path)


def test_nesting_up_to_the_cap_loads(tmp_path):
    from netbench.yamlfile import MAX_DEPTH, read_yaml

    path = tmp_path / "ok.yaml"
    path.write_text("[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "\n")
    assert read_yaml(path, "test", ProfileError) is not None


@pytest.mark.parametrize("load, error", LOADERS, ids=LOADER_IDS)
def test_a_file_over_one_mib_is_refused(tmp_path, load, error):
    path = tmp_path / "big.yaml"
    path.write_text("# padding\n" * (1 << 17) + "name: x\n")  # 1 MiB + 8 bytes
    assert "over the 1 MiB limit" in refused(load, error, path)


@pytest.mark.parametrize("load, error", LOADERS, ids=LOADER_IDS)
def test_a_device_is_refused_without_reading_it(load, error):
    # /dev/zero never ends; /dev/null is the same refusal for a file that does
    for device in ("/dev/null", "/dev/zero"):
        assert "not a regular file" in refused(load, error, device)


def test_a_folder_is_refused(tmp_path):
    assert "a folder" in refused(load_profile, ProfileError, tmp_path)


def test_a_fifo_is_refused(tmp_path):
    fifo = tmp_path / "p.yaml"
    os.mkfifo(fifo)

    def writer():  # a writer that would feed a loader reading the FIFO as a file
        try:
            with open(fifo, "w") as fh:
                fh.write("delay: 10ms\n")
        except BrokenPipeError:
            pass

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        assert "not a regular file" in refused(load_profile, ProfileError, fifo)
    finally:
        keep = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # while a reader is open, the writer's open returns
        thread.join()
        os.close(keep)


@pytest.mark.parametrize("load, error", LOADERS, ids=LOADER_IDS)
def test_an_integer_of_thousands_of_digits_is_a_clear_error(tmp_path, load, error):
    path = tmp_path / "int.yaml"
    path.write_text("name: " + "9" * 5000 + "\n")
    assert "5000 digits" in refused(load, error, path)


@pytest.mark.parametrize("text, key", [
    ("delay: '{}'\n", "delay"), ("name: x\nloss: {{model: '{}'}}\n", "loss.model"),
    ("? '{}'\n: 1\n", "x" * 40),
], ids=["delay", "loss.model", "key"])
def test_long_values_are_cut_in_messages(tmp_path, text, key):
    path = tmp_path / "p.yaml"
    path.write_text(text.format("x" * 100_000))
    message = refused(load_profile, ProfileError, path)
    assert key in message


@pytest.mark.parametrize("load, error, text", [
    (load_playbook, PlaybookError, "factors: {{latency: ['{}']}}\n"),
    (load_playbook, PlaybookError, "factors:\n  ? '{}'\n  : [1]\n"),
    (load_inventory, InventoryError, "hosts: {{h: {{ssh: a, interface: '{}'}}}}\n"),
    (load_inventory, InventoryError, "hosts:\n  ? '{}'\n  : {{ssh: a, interface: eth0}}\n"),
    (load_inventory, InventoryError, "hosts: {{h: {{ssh: a, interface: eth0, roles: ['{}']}}}}\n"),
], ids=["level", "factor", "interface", "host", "roles"])
def test_long_values_are_cut_in_playbook_and_inventory_messages(tmp_path, load, error, text):
    path = tmp_path / "f.yaml"
    path.write_text(text.format("x" * 100_000))
    refused(load, error, path)


def test_shown_cuts_values_and_keys():
    assert shown("abc") == "'abc'" and shown_key("delay") == "delay" and shown_key(5) == "5"
    assert len(shown("x" * 10_000)) <= 80 and len(shown_key("x" * 10_000)) <= 80
    assert len(shown([[["x" * 1000] * 1000] * 1000])) <= 80
    assert "digits" in shown(10**5000)
