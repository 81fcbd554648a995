"""The XML paper's experiment as a plugin of the ``paired`` protocol."""

from .protocol import PROTOCOL, XMLPaper, xml_loss_curve, xml_weight

__all__ = ["PROTOCOL", "XMLPaper", "xml_loss_curve", "xml_weight"]
