"""User-behaviour simulator: personas fitted from logged feedback, driving the service over HTTP."""
