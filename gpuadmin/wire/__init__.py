"""What the agent and central must agree on, in one place: the wire contract.

Signatures and their one encoding (``signing``), the kill order and the
protocol's words (``kill_order``, ``kill_protocol``), every Celery task's name
(``task_names``), how a moment is written (``timestamps``) and how a file is
replaced whole (``files``). The probe (on every GPU host) and central both
import it; it imports nothing else of gpuadmin, and neither Django nor Celery
(``[tool.importlinter]`` in pyproject.toml keeps it so).
"""
