"""The HL7v2 engine: message codec, datatype rules, record flow."""
