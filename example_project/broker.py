"""The example's embedded Celery broker: kombu's filesystem transport, made safe across
processes.

kombu's ``filesystem://`` transport keeps each message in a file of a shared folder.
Two details of it break under load when several processes share the folder (a web
server, two worker processes and beat here):

- ``_put`` creates the message file and writes it afterwards, while ``_get`` reads
  whatever file it finds without taking the lock, so a worker polling every 0.1 s can
  read an empty file. The JSON error that follows is raised out of the consumer loop
  and the worker stops ("Unrecoverable error: JSONDecodeError").
- ``_get`` takes a message by moving it to the system's temporary folder. When that
  folder is on another file system the move is a copy and a delete, so two workers
  can both take the same message, or one can read the other's half-copied file.

This transport writes each message under a temporary name in the queue folder and
renames it into place (a rename within one folder is atomic), and takes a message by
renaming it into a folder of its own on the same file system (of two workers, exactly
one rename succeeds). A file that still does not decode is set aside in ``rejected/``
and logged instead of stopping the worker.

It is meant for the example project and local development only: a production
deployment uses Redis or RabbitMQ (``CELERY_BROKER_URL``). Selected in settings.py with
``CELERY_BROKER_TRANSPORT = "example_project.broker:Transport"``.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path
from queue import Empty
from time import monotonic
from typing import Any

from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

logger = logging.getLogger("example_project.broker")

# Files being written end in this suffix, so no reader's ``*.QUEUE.msg`` match sees them.
_WRITING = ".writing"


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        # Zero-padded, so that names sort in time order (readers take the oldest first).
        name = f"{round(monotonic() * 1000):016d}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = final + _WRITING
        try:
            with open(partial, "wb") as file:
                file.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise filesystem.ChannelError(f"Cannot add file {final!r} to directory") from exc

    def _get(self, queue: str) -> Any:
        wanted = f"{queue}.msg"
        taken_folder = self._taken_folder()
        for name in sorted(os.listdir(self.data_folder_in)):
            if name.partition(".")[2] != wanted:
                continue
            taken = taken_folder / name
            try:
                # Atomic on one file system: if another worker took it first, this fails.
                os.rename(os.path.join(self.data_folder_in, name), taken)
            except OSError:
                continue
            try:
                payload = taken.read_bytes()
            except OSError as exc:
                raise filesystem.ChannelError(f"Cannot read file {str(taken)!r} from queue.") from exc
            try:
                message = loads(bytes_to_str(payload))
            except (ValueError, json.JSONDecodeError):
                rejected = self._folder("rejected") / name
                os.replace(taken, rejected)
                logger.error("set aside a broker message that does not decode: %s", rejected)
                continue
            taken.unlink(missing_ok=True)
            return message
        raise Empty()

    def _taken_folder(self) -> Path:
        return self._folder("taken")

    def _folder(self, name: str) -> Path:
        # Beside the queue folder, so renames between them stay on one file system.
        folder = Path(self.data_folder_in).parent / name
        folder.mkdir(exist_ok=True)
        return folder


class Transport(filesystem.Transport):
    Channel = Channel
