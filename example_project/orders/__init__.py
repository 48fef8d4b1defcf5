"""The demo app: orders fulfilled by the ``orders.fulfil`` workflow."""
