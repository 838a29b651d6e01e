package bth

import "encoding/binary"

// Packet is one RoCEv2 transport packet: the BTH, the extended headers its
// opcode calls for, the payload and the ICRC. Only the extended headers named
// by BTH.Opcode.Info().Ext are meaningful; the others keep whatever they held.
//
// A Packet is a plain value: decode into one that is reused to avoid
// allocation. It is not safe for concurrent use.
type Packet struct {
	BTH          BTH
	DETH         DETH
	RETH         RETH
	AtomicETH    AtomicETH
	AETH         AETH
	AtomicAckETH AtomicAckETH
	ImmDt        ImmDt
	IETH         IETH
	// Payload is the data after the headers, without pad and ICRC. After
	// Decode it aliases the decoded buffer; after DecodePrefix it is the
	// part of the payload that was captured.
	Payload []byte
	// ICRC is the invariant CRC as read by Decode (the CRC value; on the
	// wire its bytes are little-endian); 0 after DecodePrefix of a packet
	// cut before its ICRC. Append computes its own and ignores this field.
	ICRC uint32
}

// Decode parses b, a whole UDP payload from the BTH to the ICRC included,
// into p. It checks that b holds every header the opcode needs and the ICRC,
// that PadCnt fits, and that opcodes without payload carry none; it does not
// check the ICRC (that needs the IP and UDP headers: see ICRC).
//
// Errors are *DecodeError wrapping ErrTruncated, ErrUnknownOpcode, ErrTVer,
// ErrPadCnt or ErrUnexpectedPayload. When only the BTH decoded (unknown
// opcode, bad TVer, truncated extended header), p.BTH is still filled in.
// Decode does not allocate on valid packets; the *DecodeError of an invalid
// one is allocated.
func (p *Packet) Decode(b []byte) error {
	off, info, err := p.decodeHeaders(b)
	if err != nil {
		return err
	}
	op := p.BTH.Opcode
	if len(b) < off+ICRCLen {
		return &DecodeError{Err: ErrTruncated, Header: "ICRC", Opcode: op, OpcodeKnown: true, Need: off + ICRCLen, Have: len(b)}
	}
	end := len(b) - ICRCLen
	rest := b[off:end]
	pad := int(p.BTH.PadCnt)
	if !info.Payload && len(rest) != 0 {
		return &DecodeError{Err: ErrUnexpectedPayload, Header: "payload", Opcode: op, OpcodeKnown: true, Need: off + ICRCLen, Have: len(b)}
	}
	if pad > len(rest) {
		return &DecodeError{Err: ErrPadCnt, Header: "payload", Opcode: op, OpcodeKnown: true, Need: off + pad + ICRCLen, Have: len(b)}
	}
	p.Payload = rest[: len(rest)-pad : len(rest)-pad]
	p.ICRC = binary.LittleEndian.Uint32(b[end:])
	return nil
}

// DecodePrefix decodes a packet of which only the first bytes were
// captured, as in a capture cut by its snapshot length. b holds the first
// bytes of a UDP payload (BTH to ICRC) of total bytes, total being the
// payload length the UDP header gives (UDP length - 8).
//
// The BTH and the extended headers of the opcode are decoded from b; they
// must all be in b. The checks of Decode that need the length, not the
// bytes, are made against total: that the packet holds its headers and the
// ICRC, that PadCnt fits, that opcodes without payload carry none. Payload
// is the payload bytes present in b, without the pad and ICRC when b reaches
// them; the payload length on the wire is
//
//	total - BTHLen - Opcode.Info().Ext.Len() - PadCnt - ICRCLen
//
// ICRC is set to 0 when b does not hold it. When b holds the whole packet
// (len(b) >= total), DecodePrefix is Decode(b[:total]).
//
// Errors are those of Decode: ErrTruncated only when b ends inside the
// headers or total is too small for the headers and the ICRC. DecodePrefix
// does not allocate on valid packets.
func (p *Packet) DecodePrefix(b []byte, total int) error {
	if len(b) >= total {
		return p.Decode(b[:max(total, 0)])
	}
	off, info, err := p.decodeHeaders(b)
	if err != nil {
		return err
	}
	op := p.BTH.Opcode
	if total < off+ICRCLen {
		return &DecodeError{Err: ErrTruncated, Header: "ICRC", Opcode: op, OpcodeKnown: true, Need: off + ICRCLen, Have: total}
	}
	rest := total - off - ICRCLen
	pad := int(p.BTH.PadCnt)
	if !info.Payload && rest != 0 {
		return &DecodeError{Err: ErrUnexpectedPayload, Header: "payload", Opcode: op, OpcodeKnown: true, Need: off + ICRCLen, Have: total}
	}
	if pad > rest {
		return &DecodeError{Err: ErrPadCnt, Header: "payload", Opcode: op, OpcodeKnown: true, Need: off + pad + ICRCLen, Have: total}
	}
	end := min(off+rest-pad, len(b))
	p.Payload = b[off:end:end]
	p.ICRC = 0
	return nil
}

// decodeHeaders decodes the BTH and the extended headers of its opcode from
// b and returns where the headers end and the opcode's table entry.
func (p *Packet) decodeHeaders(b []byte) (int, *OpInfo, error) {
	if err := p.BTH.Decode(b); err != nil {
		return 0, nil, err
	}
	op := p.BTH.Opcode
	info := op.Info()
	if info == nil {
		return 0, nil, &DecodeError{Err: ErrUnknownOpcode, Header: "BTH", Opcode: op, OpcodeKnown: true}
	}
	if p.BTH.TVer != 0 {
		return 0, nil, &DecodeError{Err: ErrTVer, Header: "BTH", Opcode: op, OpcodeKnown: true}
	}
	off := BTHLen
	if info.Ext == 0 {
		return off, info, nil // MIDDLE packets and most others: the BTH alone
	}
	for e := info.Ext & extAll; e != 0; {
		var x *extHeader
		x, e = e.next()
		if len(b) < off+x.size {
			return 0, nil, &DecodeError{Err: ErrTruncated, Header: x.name, Opcode: op, OpcodeKnown: true, Need: off + x.size, Have: len(b)}
		}
		h := b[off:]
		switch x.ext {
		case ExtDETH:
			p.DETH.Decode(h)
		case ExtRETH:
			p.RETH.Decode(h)
		case ExtAtomicETH:
			p.AtomicETH.Decode(h)
		case ExtAETH:
			p.AETH.Decode(h)
		case ExtAtomicAckETH:
			p.AtomicAckETH.Decode(h)
		case ExtImmDt:
			p.ImmDt.Decode(h)
		case ExtIETH:
			p.IETH.Decode(h)
		}
		off += x.size
	}
	return off, info, nil
}

// Len returns the UDP payload size Append will produce: headers, payload,
// pad and ICRC. It is 0 for an opcode not in the table.
func (p *Packet) Len() int {
	info := p.BTH.Opcode.Info()
	if info == nil {
		return 0
	}
	return BTHLen + info.Ext.Len() + len(p.Payload) + PadLen(len(p.Payload)) + ICRCLen
}

// PadLen returns the pad that brings n payload bytes to a multiple of 4,
// (-n) & 3 as in IBTA 9.2.5.
func PadLen(n int) int { return -n & 3 }

// AppendHeaders appends the BTH, with PadCnt set from len(p.Payload), and
// the extended headers of p's opcode to b. It refuses opcodes not in the
// table, fields wider than the wire (ErrFieldRange) and payload on an opcode
// that carries none.
func (p *Packet) AppendHeaders(b []byte) ([]byte, error) {
	info := p.BTH.Opcode.Info()
	if info == nil {
		return b, &DecodeError{Err: ErrUnknownOpcode, Header: "BTH", Opcode: p.BTH.Opcode, OpcodeKnown: true}
	}
	if !info.Payload && len(p.Payload) != 0 {
		return b, &DecodeError{Err: ErrUnexpectedPayload, Header: "payload", Opcode: p.BTH.Opcode, OpcodeKnown: true, Have: len(p.Payload)}
	}
	h := p.BTH
	h.PadCnt = uint8(PadLen(len(p.Payload)))
	if err := h.Check(); err != nil {
		return b, err
	}
	if info.Ext&ExtAETH != 0 && p.AETH.MSN > 0xFFFFFF {
		return b, &DecodeError{Err: ErrFieldRange, Header: "AETH MSN", Opcode: h.Opcode, OpcodeKnown: true}
	}
	if info.Ext&ExtDETH != 0 && p.DETH.SrcQP > 0xFFFFFF {
		return b, &DecodeError{Err: ErrFieldRange, Header: "DETH SrcQP", Opcode: h.Opcode, OpcodeKnown: true}
	}
	b = h.Append(b)
	for e := info.Ext & extAll; e != 0; {
		var x *extHeader
		x, e = e.next()
		switch x.ext {
		case ExtDETH:
			b = p.DETH.Append(b)
		case ExtRETH:
			b = p.RETH.Append(b)
		case ExtAtomicETH:
			b = p.AtomicETH.Append(b)
		case ExtAETH:
			b = p.AETH.Append(b)
		case ExtAtomicAckETH:
			b = p.AtomicAckETH.Append(b)
		case ExtImmDt:
			b = p.ImmDt.Append(b)
		case ExtIETH:
			b = p.IETH.Append(b)
		case ExtCNP:
			b = append(b, make([]byte, CNPReservedLen)...)
		}
	}
	return b, nil
}

// AppendTransport appends the packet without its ICRC: headers, payload and
// pad. Add the ICRC with AppendICRC once the IP and UDP headers are known.
func (p *Packet) AppendTransport(b []byte) ([]byte, error) {
	b, err := p.AppendHeaders(b)
	if err != nil {
		return b, err
	}
	b = append(b, p.Payload...)
	for range PadLen(len(p.Payload)) {
		b = append(b, 0)
	}
	return b, nil
}

// Append appends the whole UDP payload of p, ICRC included, as it travels
// inside the IP and UDP headers that e describes. It writes nothing of b's
// backing array beyond what it appends. On error b is returned unchanged.
func (p *Packet) Append(b []byte, e *Encap) ([]byte, error) {
	return p.append(b, e, false)
}

// AppendScratch is Append, but it may also overwrite up to AppendSpare
// bytes of b's spare capacity past what it appends, to compute the ICRC
// there without table lookups (see AppendSpare): for a buffer whose tail
// holds nothing the caller needs, as the Endpoint's arena.
func (p *Packet) AppendScratch(b []byte, e *Encap) ([]byte, error) {
	return p.append(b, e, true)
}

func (p *Packet) append(b []byte, e *Encap, scratch bool) ([]byte, error) {
	orig := b
	b, err := p.AppendTransport(b)
	if err != nil {
		return orig, err
	}
	b, err = e.appendICRC(b, len(b)-len(orig), scratch)
	if err != nil {
		return orig, err
	}
	return b, nil
}
