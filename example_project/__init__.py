"""The example project: a Django site that fulfils orders with a durable workflow."""
